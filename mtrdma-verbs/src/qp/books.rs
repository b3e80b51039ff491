//! The books of a queue pair's work requests in flight: the buffers they
//! own until their completions, and the raw work requests of the layer
//! above.

use std::collections::VecDeque;

use super::*;

/// `wr_id`s with this bit set belong to a layer above (the scheduled
/// queue pair), which owns their buffers; [`Sink::poll`] hands their
/// completions back as they are.
pub(crate) const RAW_WR: u64 = 1 << 63;

/// `wr_id`s with this bit (and not [`RAW_WR`]) are the queue pair's own,
/// parked like the direct path's, but posted by a scheduled queue pair:
/// their completion goes to `out` with the request's length, and [`Sink::poll`]
/// also reports a raw completion with `wr_id` [`PARKED_DONE`] so the
/// scheduler counts the piece as finished.
pub(crate) const SCHED_WR: u64 = 1 << 62;

/// The raw completion that says one of the [`SCHED_WR`] requests finished.
pub(crate) const PARKED_DONE: u64 = RAW_WR | SCHED_WR;

/// Device `wr_id`s of send-side work requests carry this bit, and the
/// request's number among the queue pair's sends in the bits under
/// [`SEQ_SHIFT`] ([`Books::tag_send`]; bit 61 marks receives of a shared
/// receive queue, `srq::SRQ_WR`): a send's completion also reports
/// the unsignaled sends posted before it (RC and UD send queues complete
/// in order), which the books find by their numbers
/// ([`Books::complete_device`]).
pub(crate) const SENT_WR: u64 = 1 << 60;

/// Where a send's number sits in its device `wr_id` (bits 40 to 59; the
/// queue pair's own `wr_id`s, slab keys, stay below).
const SEQ_SHIFT: u32 = 40;

/// The bits of a send's number.
const SEQ_MASK: u64 = (1 << 20) - 1;

/// Everything a device `wr_id` carries beyond the request's own.
const DEVICE_BITS: u64 = SENT_WR | (SEQ_MASK << SEQ_SHIFT);

/// The `wr_id` of a zero-length RDMA WRITE that asks for its completion,
/// posted only to report unsignaled requests that a refused list left
/// without a signaled one after them ([`Sink::post_list`]); its
/// completion reports nothing of its own.
pub(crate) const NOP_WR: u64 = RAW_WR | SCHED_WR | 1;

/// The `wr_id` of a memory window's bind ([`QueuePair::lend`]): it
/// reports nothing of its own (the lent piece stays in the queue pair
/// until it is taken back); a failed one is logged, and the queue pair is
/// then in the error state.
pub(crate) const BIND_WR: u64 = RAW_WR | SCHED_WR | 2;

/// The queue pair's own `wr_id` of a device `wr_id` (its slot, for the
/// direct path's requests).
#[inline]
pub(crate) fn own_wr_id(device_wr_id: u64) -> u64 {
    device_wr_id & !DEVICE_BITS
}

/// `wr_id`s with this bit (and not [`RAW_WR`]) are pieces of a group: a
/// batch's requests parked together ([`Books::park_group`]), the group's
/// key in the bits under [`GROUP_ITEM_SHIFT`] and the piece's place in it
/// above. They are not numbered ([`Books::tag_send`]): a completion of
/// one reports the group's pieces before it, which the group keeps in
/// order.
pub(crate) const GROUP_WR: u64 = 1 << 39;

/// With [`GROUP_WR`]: the zero-length WRITE that reports a group's
/// unsignaled pieces up to the one it names, after the device took only
/// part of the group's list ([`Sink::post_list`]'s `report_quiet`).
pub(crate) const GROUP_NOP: u64 = 1 << 38;

/// Where a piece's place in its group sits in its `wr_id`.
const GROUP_ITEM_SHIFT: u32 = 20;

/// The bits of a group's key.
const GROUP_KEY_MASK: u64 = (1 << GROUP_ITEM_SHIFT) - 1;

/// The bits of a piece's place in its group (bits 20 to 37).
const GROUP_ITEM_MASK: u64 = (1 << 18) - 1;

/// The most requests one group (one batch) may hold.
pub(crate) const GROUP_MAX: usize = GROUP_ITEM_MASK as usize + 1;

/// The `wr_id` of the piece `item` places into the group `key`.
#[inline]
pub(crate) fn group_wr_id(key: usize, item: usize) -> u64 {
    GROUP_WR | key as u64 | ((item as u64) << GROUP_ITEM_SHIFT)
}

/// A work request in flight: its region stays here until it completes.
pub(crate) struct Slot<R> {
    pub(crate) context: u64,
    pub(crate) region: R,
    /// A gather request's regions after the first, in order (empty for
    /// every other request): parked with it, handed back with it.
    pub(crate) rest: Vec<R>,
    pub(crate) send: bool,
    /// Bytes of a send (reported for [`SCHED_WR`] requests).
    pub(crate) len: u32,
}

impl<R> Slot<R> {
    /// A receive of `region`, completing with `context`.
    pub(crate) fn recv(context: u64, region: R) -> Slot<R> {
        Slot {
            context,
            region,
            rest: Vec::new(),
            send: false,
            len: 0,
        }
    }

    /// Its regions, in order: the first, then a gather request's others.
    pub(crate) fn into_regions(self) -> impl Iterator<Item = R> {
        std::iter::once(self.region).chain(self.rest)
    }
}

/// A request of a group (a batch's requests parked together): its region
/// stays here until its completion, or the completion of a later piece
/// of the group, is polled.
pub(crate) struct Grouped<R> {
    pub(crate) context: u64,
    pub(crate) region: R,
    /// A gather request's regions after the first, in order.
    pub(crate) rest: Vec<R>,
    /// Its bytes (what its completion reports).
    pub(crate) len: u32,
    /// The completion opcode it reports when a later piece's completion
    /// reports it ([`wc_opcode_of`]).
    pub(crate) opcode: ffi::ibv_wc_opcode::Type,
}

impl<R> Grouped<R> {
    /// Its regions, in order, each with its context.
    pub(crate) fn into_entries(self) -> impl Iterator<Item = (u64, R)> {
        let context = self.context;
        std::iter::once(self.region)
            .chain(self.rest)
            .map(move |region| (context, region))
    }
}

/// Room for a batch's work requests and their scatter entries, kept by
/// the books between batches ([`Batch`]).
#[derive(Default)]
pub(crate) struct ListScratch {
    /// The work requests, in order (`wr_id`, signaling, links and single
    /// scatter entries are set when the batch is submitted).
    pub(crate) wrs: Vec<ffi::ibv_send_wr>,
    /// Each work request's scatter entry (unused for a gather request of
    /// several entries, whose list the batch keeps).
    pub(crate) sges: Vec<ffi::ibv_sge>,
}

// SAFETY: the only pointers in these requests are set by `Batch::submit`,
// which hands them to the device within the same call, and gather
// requests' scatter lists, owned by the same batch; the books keep the
// vectors empty between batches, for their room only.
unsafe impl Send for ListScratch {}
// SAFETY: as above; a shared reference reads no pointee.
unsafe impl Sync for ListScratch {}

/// A queue pair's batches ([`Batch`]): those in flight, and room kept for
/// the next.
struct Batches<R> {
    /// Batches parked together, each under one key ([`GROUP_WR`]).
    groups: Slab<Group<R>>,
    /// Emptied groups' queues, kept for the next batches.
    spare: Vec<Vec<Grouped<R>>>,
    /// Room for the next batch's work requests.
    scratch: ListScratch,
}

/// A group in flight: its requests not yet reported, in order.
struct Group<R> {
    pieces: VecDeque<Grouped<R>>,
    /// The place in the group of the first of `pieces`.
    first: usize,
    /// Posted by a scheduled queue pair: each piece's completion also
    /// reports a raw completion [`PARKED_DONE`] (see [`SCHED_WR`]).
    sched: bool,
}

/// A queue pair's own bookkeeping, apart from the device: the regions of
/// its work requests in flight, parked under their `wr_id`s, and the
/// number of requests in each queue.
pub(crate) struct Books<R> {
    slots: Slab<Slot<R>>,
    /// Batches in flight and room for the next (boxed: a queue pair stays
    /// small to move).
    batches: Box<Batches<R>>,
    /// The unsignaled send-side work requests in the device, oldest
    /// first, of a sink that numbers its sends ([`tag_send`](Self::tag_send)):
    /// their numbers, their own `wr_id`s and the completion opcode each
    /// reports.
    quiet: VecDeque<(u64, u64, ffi::ibv_wc_opcode::Type)>,
    /// Sends numbered so far.
    sends: u64,
    pub(crate) sends_in_flight: u32,
    pub(crate) recvs_in_flight: u32,
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    /// The scatter entries a send work request may have: the most regions
    /// a gather request may name.
    pub(crate) max_send_sge: u32,
}

impl Wc {
    /// What the books need of `wc`, with a UD receive's `source`.
    #[inline]
    pub(crate) fn from_raw(wc: &RawWc, source: Option<crate::ud::UdSource>) -> Wc {
        Wc {
            wr_id: wc.wr_id,
            status: wc.status,
            // Read only on success, where it is defined.
            opcode: wc.opcode.unwrap_or(u32::MAX),
            // Defined for receives (a send reports its posted length).
            byte_len: wc.byte_len.unwrap_or(0),
            imm: wc.imm,
            source,
        }
    }
}

/// One work completion as the device reported it.
pub(crate) struct Wc {
    pub(crate) wr_id: u64,
    pub(crate) status: WcStatus,
    pub(crate) opcode: ffi::ibv_wc_opcode::Type,
    pub(crate) byte_len: u32,
    /// Immediate data, in network order.
    pub(crate) imm: Option<u32>,
    /// A UD receive's source.
    pub(crate) source: Option<crate::ud::UdSource>,
}

impl<R: Region> Books<R> {
    /// Finishes a queue pair's `Debug` output with its requests in flight.
    pub(crate) fn debug_in_flight(&self, f: &mut fmt::DebugStruct<'_, '_>) -> fmt::Result {
        f.field("sends_in_flight", &self.sends_in_flight)
            .field("recvs_in_flight", &self.recvs_in_flight)
            .finish()
    }

    pub(crate) fn new(max_send_wr: u32, max_recv_wr: u32) -> Self {
        Books {
            slots: Slab::default(),
            batches: Box::new(Batches {
                groups: Slab::default(),
                spare: Vec::new(),
                scratch: ListScratch::default(),
            }),
            quiet: VecDeque::new(),
            sends: 0,
            sends_in_flight: 0,
            recvs_in_flight: 0,
            max_send_wr,
            max_recv_wr,
            max_send_sge: 1,
        }
    }

    /// The same books, for a send queue whose work requests take up to
    /// `n` scatter entries.
    pub(crate) fn with_max_send_sge(mut self, n: u32) -> Self {
        self.max_send_sge = n.max(1);
        self
    }

    pub(crate) fn park(&mut self, slot: Slot<R>) -> usize {
        self.slots.insert(slot)
    }

    pub(crate) fn unpark(&mut self, i: usize) -> Option<Slot<R>> {
        self.slots.remove(i)
    }

    /// Parks `region` for a send-side request `op` that `check_send` found
    /// to be `sge`, if the send queue has room for it; returns its work
    /// request (`wr_id`: the slot; it asks for its completion). On refusal
    /// the region comes back.
    #[inline]
    pub(crate) fn park_send(
        &mut self,
        op: SendOp,
        region: R,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Result<RawSend, (Error, R)> {
        if self.sends_in_flight >= self.max_send_wr {
            let depth = self.max_send_wr;
            return Err((Error::SendQueueFull { depth }, region));
        }
        let ud = region.datagram();
        let extra = region.extra(true, true);
        let slot = self.park(Slot {
            context,
            region,
            rest: Vec::new(),
            send: true,
            len: sge.length,
        });
        Ok(RawSend::new(slot as u64, op, true, sge, ud, extra, false))
    }

    /// Parks the regions of a gather request `op` that [`check_gather`]
    /// found to be `gather`, if the send queue has room for it; returns its
    /// work request (it asks for its completion), whose
    /// scatter list is `gather.sges` (it must stay where it is until the
    /// request is handed to the device). On refusal the regions come back,
    /// in order.
    pub(crate) fn park_gather(
        &mut self,
        op: SendOp,
        regions: Vec<R>,
        gather: &Gather,
        context: u64,
    ) -> Result<RawSend, (Error, Vec<R>)> {
        if self.sends_in_flight >= self.max_send_wr {
            let depth = self.max_send_wr;
            return Err((Error::SendQueueFull { depth }, regions));
        }
        let mut regions = regions.into_iter();
        let Some(first) = regions.next() else {
            return Err((Error::EmptyGather, Vec::new()));
        };
        let rest: Vec<R> = regions.collect();
        let ud = first.datagram();
        let mut extra = first.extra(true, true);
        let sge = gather.first_entry(&mut extra);
        let slot = self.park(Slot {
            context,
            region: first,
            rest,
            send: true,
            len: gather.len,
        });
        Ok(RawSend::new(slot as u64, op, true, sge, ud, extra, false))
    }

    /// The region parked under `wr_id` (one of the queue pair's own work
    /// requests), if any.
    pub(crate) fn parked(&self, wr_id: u64) -> Option<&R> {
        if wr_id & RAW_WR != 0 {
            return None;
        }
        let i = usize::try_from(wr_id & !SCHED_WR).ok()?;
        self.slots.get(i).map(|slot| &slot.region)
    }

    /// Work requests in flight, both queues.
    pub(crate) fn outstanding(&self) -> u32 {
        self.sends_in_flight + self.recvs_in_flight
    }

    /// Takes every parked region out (teardown).
    pub(crate) fn drain_regions(&mut self) -> impl Iterator<Item = R> + '_ {
        self.quiet.clear();
        self.slots.drain().flat_map(Slot::into_regions).chain(
            self.batches
                .groups
                .drain()
                .flat_map(|g| g.pieces.into_iter().flat_map(|p| p.into_entries()))
                .map(|(_, region)| region),
        )
    }

    /// An empty queue for a batch's requests (an emptied group's, if
    /// any).
    #[inline]
    pub(crate) fn group_queue(&mut self) -> Vec<Grouped<R>> {
        self.batches.spare.pop().unwrap_or_default()
    }

    /// Room for a batch's work requests (empty).
    #[inline]
    pub(crate) fn take_list_scratch(&mut self) -> ListScratch {
        std::mem::take(&mut self.batches.scratch)
    }

    /// Keeps the room of a batch's work requests for the next one.
    #[inline]
    pub(crate) fn keep_list_scratch(&mut self, mut scratch: ListScratch) {
        scratch.wrs.clear();
        scratch.sges.clear();
        self.batches.scratch = scratch;
    }

    /// Keeps an emptied queue for the next batch.
    #[inline]
    pub(crate) fn recycle(&mut self, queue: impl Into<Vec<Grouped<R>>>) {
        let mut queue = queue.into();
        queue.clear();
        if self.batches.spare.len() < 4 {
            self.batches.spare.push(queue);
        }
    }

    /// Parks a batch's requests, in order, as one group; returns its key
    /// (see [`group_wr_id`]). Nothing of them is counted in flight until
    /// posted.
    #[inline]
    pub(crate) fn park_group(&mut self, pieces: Vec<Grouped<R>>, sched: bool) -> usize {
        debug_assert!(pieces.len() <= GROUP_MAX);
        self.batches.groups.insert(Group {
            pieces: pieces.into(),
            first: 0,
            sched,
        })
    }

    /// Takes the pieces of group `key` from place `from` on out of the
    /// books, in order: the device did not take them. The group goes if
    /// nothing of it is left.
    pub(crate) fn unpark_group_from(&mut self, key: usize, from: usize) -> Vec<Grouped<R>> {
        let Some(group) = self.batches.groups.get_mut(key) else {
            return Vec::new();
        };
        let at = from.saturating_sub(group.first).min(group.pieces.len());
        let back: Vec<Grouped<R>> = group.pieces.drain(at..).collect();
        if group.pieces.is_empty() {
            if let Some(group) = self.batches.groups.remove(key) {
                self.recycle(group.pieces);
            }
        }
        back
    }

    /// Numbers the send-side work request `wr_id` of verbs opcode
    /// `opcode`, about to be posted (`signaled`: it asks for its
    /// completion): returns the `wr_id` the device is given.
    #[inline]
    pub(crate) fn tag_send(
        &mut self,
        wr_id: u64,
        opcode: ffi::ibv_wr_opcode::Type,
        signaled: bool,
    ) -> u64 {
        if wr_id & (GROUP_WR | RAW_WR) == GROUP_WR {
            // A group's pieces are found by their place in it.
            return wr_id;
        }
        let seq = self.sends & SEQ_MASK;
        self.sends = self.sends.wrapping_add(1);
        if !signaled {
            self.quiet.push_back((seq, wr_id, wc_opcode_of(opcode)));
        }
        wr_id | SENT_WR | (seq << SEQ_SHIFT)
    }

    /// Forgets the last `n` numbered requests: the device refused them.
    #[inline]
    pub(crate) fn untag_sends(&mut self, n: usize) {
        self.sends = self.sends.wrapping_sub(n as u64);
        let first = self.sends & SEQ_MASK;
        while let Some(&(seq, ..)) = self.quiet.back() {
            if seq.wrapping_sub(first) & SEQ_MASK >= n as u64 {
                break;
            }
            self.quiet.pop_back();
        }
    }

    /// Matches a completion the device reported, on a sink that numbers
    /// its sends ([`tag_send`](Self::tag_send)): a send's completion also
    /// completes, as succeeded, the unsignaled sends posted before it (the
    /// send queue completes in order, and a failed request reports itself
    /// whether signaled or not); a receive's is matched as it is.
    #[inline]
    pub(crate) fn complete_device(
        &mut self,
        wc: Wc,
        out: &mut Vec<R::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) {
        let own = Wc {
            wr_id: wc.wr_id & !DEVICE_BITS,
            ..wc
        };
        if wc.wr_id & SENT_WR == 0 || self.quiet.is_empty() {
            self.complete(own, out, raw);
        } else {
            self.complete_after_quiet((wc.wr_id >> SEQ_SHIFT) & SEQ_MASK, own, out, raw);
        }
    }

    /// [`complete_device`](Self::complete_device) of send number `seq`
    /// while unsignaled sends are in the device: those numbered before it
    /// complete first (succeeded), and it, if unsignaled, leaves them.
    #[inline(never)]
    fn complete_after_quiet(
        &mut self,
        seq: u64,
        wc: Wc,
        out: &mut Vec<R::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) {
        // At most the send queue's depth is in the device, far fewer than
        // half the numbers: a number "after" `seq` is one within half the
        // range above it.
        while let Some(&(at, wr_id, opcode)) = self.quiet.front() {
            let behind = seq.wrapping_sub(at) & SEQ_MASK;
            if behind > SEQ_MASK / 2 {
                break;
            }
            self.quiet.pop_front();
            if behind == 0 {
                // The unsignaled request itself (failed, or flushed).
                break;
            }
            let implied = Wc {
                wr_id,
                status: WcStatus::Success,
                opcode,
                byte_len: 0,
                imm: None,
                source: None,
            };
            self.complete_as(implied, false, out, raw);
        }
        self.complete_as(wc, true, out, raw);
    }

    /// Matches one completion to its work request: a raw one goes to
    /// `raw` as it is; one of the queue pair's own hands its parked
    /// region back in `out`.
    #[inline]
    pub(crate) fn complete(
        &mut self,
        wc: Wc,
        out: &mut Vec<R::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) {
        self.complete_as(wc, true, out, raw);
    }

    /// [`complete`](Self::complete); `sampled`: the device reported it
    /// itself (see [`RawCompletion::sampled`]).
    pub(crate) fn complete_as(
        &mut self,
        wc: Wc,
        sampled: bool,
        out: &mut Vec<R::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) {
        if wc.wr_id & RAW_WR != 0 {
            self.sends_in_flight -= 1;
            if wc.wr_id == NOP_WR {
                return;
            }
            if wc.wr_id == BIND_WR {
                if !wc.status.is_success() {
                    tracing::warn!(status = ?wc.status, "binding a memory window to lend a piece failed");
                }
                return;
            }
            raw.push(RawCompletion {
                wr_id: wc.wr_id,
                status: wc.status,
                sampled,
            });
            return;
        }
        if wc.wr_id & GROUP_WR != 0 {
            self.complete_group(wc, sampled, out, raw);
            return;
        }
        let sched = wc.wr_id & SCHED_WR != 0;
        let Some(slot) = usize::try_from(wc.wr_id & !SCHED_WR)
            .ok()
            .and_then(|i| self.unpark(i))
        else {
            tracing::error!(wr_id = wc.wr_id, "completion for an unknown work request");
            return;
        };
        if slot.send {
            self.sends_in_flight -= 1;
        } else {
            self.recvs_in_flight -= 1;
        }
        let opcode = opcode_of(wc.status, wc.opcode);
        // A send reports the length it was posted with (a scheduled one
        // its request's, as the scheduler does for the requests it
        // splits): the device defines a length only for receives, READs
        // and atomics.
        let byte_len = if sched || slot.send {
            slot.len
        } else {
            wc.byte_len
        };
        push_in_place(
            out,
            slot.region.complete_from(
                (
                    slot.context,
                    wc.status,
                    opcode,
                    byte_len,
                    wc.imm.map(u32::from_be),
                ),
                wc.source,
            ),
        );
        if !slot.rest.is_empty() {
            let done = out.last_mut().expect("just pushed");
            R::attach_rest(done, slot.rest);
        }
        if sched {
            raw.push(RawCompletion {
                wr_id: PARKED_DONE,
                status: wc.status,
                sampled,
            });
        }
    }
}

impl<R: Region> Books<R> {
    /// A completion of a group's piece ([`GROUP_WR`]): the group's pieces
    /// before it that are not yet reported completed, as succeeded (the
    /// send queue completes in order, and a failed request reports
    /// itself), then it with its status (unless it is the group's
    /// [`GROUP_NOP`], which reports only those before it, and itself). A
    /// scheduled queue pair's group also reports a raw [`PARKED_DONE`]
    /// for each, `sampled` for it alone.
    fn complete_group(
        &mut self,
        wc: Wc,
        sampled: bool,
        out: &mut Vec<R::Completion>,
        raw: &mut Vec<RawCompletion>,
    ) {
        let key = (wc.wr_id & GROUP_KEY_MASK) as usize;
        let item = ((wc.wr_id >> GROUP_ITEM_SHIFT) & GROUP_ITEM_MASK) as usize;
        let nop = wc.wr_id & GROUP_NOP != 0;
        if nop {
            self.sends_in_flight -= 1;
        }
        let Some(group) = self.batches.groups.get_mut(key) else {
            if !nop {
                tracing::error!(wr_id = wc.wr_id, "completion for an unknown work request");
            }
            return;
        };
        let mut reported = 0u32;
        while group.first <= item {
            let Some(piece) = group.pieces.pop_front() else {
                break;
            };
            let this = group.first == item && !nop;
            group.first += 1;
            reported += 1;
            let (status, opcode) = if this {
                (wc.status, wc.opcode)
            } else {
                (WcStatus::Success, piece.opcode)
            };
            push_in_place(
                out,
                piece.region.complete_from(
                    (
                        piece.context,
                        status,
                        opcode_of(status, opcode),
                        piece.len,
                        None,
                    ),
                    None,
                ),
            );
            if !piece.rest.is_empty() {
                let done = out.last_mut().expect("just pushed");
                R::attach_rest(done, piece.rest);
            }
            if group.sched {
                raw.push(RawCompletion {
                    wr_id: PARKED_DONE,
                    status,
                    sampled: this && sampled,
                });
            }
        }
        let empty = group.pieces.is_empty();
        self.sends_in_flight -= reported;
        if empty {
            if let Some(group) = self.batches.groups.remove(key) {
                self.recycle(group.pieces);
            }
        }
    }
}

/// The [`Opcode`] a completion of `status` and verbs completion opcode
/// `opcode` reports.
#[inline]
fn opcode_of(status: WcStatus, opcode: ffi::ibv_wc_opcode::Type) -> Opcode {
    if !status.is_success() {
        return Opcode::Unknown;
    }
    use ffi::ibv_wc_opcode as o;
    match opcode {
        o::IBV_WC_SEND => Opcode::Send,
        o::IBV_WC_RDMA_WRITE => Opcode::Write,
        o::IBV_WC_RDMA_READ => Opcode::Read,
        o::IBV_WC_COMP_SWAP | o::IBV_WC_FETCH_ADD => Opcode::Atomic,
        o::IBV_WC_RECV => Opcode::Recv,
        o::IBV_WC_RECV_RDMA_WITH_IMM => Opcode::RecvWithImm,
        o::IBV_WC_LOCAL_INV => Opcode::Invalidate,
        _ => Opcode::Unknown,
    }
}
