//! A UD queue pair as the data path's sink: how sends are built and
//! posted and completions read, for the direct and the scheduled paths.

use super::*;

impl Sink for UdQueuePair {
    sink_books!(queue pair of UdRegion);

    unsafe fn post_wr_list(&mut self, wr: &mut ffi::ibv_send_wr) -> Result<(), (usize, Error)> {
        // SAFETY: the QP is live while `self` is; the caller keeps the
        // buffers and the address handles alive until the completions
        // (both are in the requests' `UdRegion`s).
        unsafe { post_send_list(self.qp, wr, &mut self.books, &self.pd, |_| {}) }
    }

    fn poll(
        &mut self,
        out: &mut Vec<UdCompletion>,
        raw: &mut Vec<RawCompletion>,
    ) -> Result<usize, Error> {
        let grh_addr = self.grh_addr;
        self.cq
            .poll_each(|wc| {
                if let Some(c) = self.srq.as_ref().and_then(|srq| srq.complete_ud(&wc)) {
                    out.push(c);
                    return;
                }
                // A receive's GRH cell: its source is read, and the cell freed.
                let cell = match self.books.parked(wc.wr_id) {
                    Some(UdRegion {
                        kind: UdKind::Recv { cell },
                        ..
                    }) => Some(*cell),
                    _ => None,
                };
                let cells = self.books.max_recv_wr as usize;
                let source = cell.and_then(|cell| {
                    self.free_cells.push(cell);
                    // SAFETY: the GRH buffer lives as long as `self`; the
                    // cell's receive has completed, so the NIC is done
                    // writing it, and it is not reposted before this copy.
                    let grh = || unsafe { copy_grh(grh_addr, cells, cell) };
                    wc.src_qp.map(|qpn| UdSource {
                        qpn,
                        gid: wc.grh.then(|| grh_source_gid(&grh())).flatten(),
                    })
                });
                let mut entry = Wc::from_raw(&wc, source);
                if cell.is_some() {
                    // The payload only: the GRH is not the caller's.
                    entry.byte_len = entry.byte_len.saturating_sub(GRH_BYTES as u32);
                }
                self.books.complete_device(entry, out, raw);
            })
            .map_err(|source| self.verbs_error(("ibv_poll_cq", source)))
    }

    fn shutdown(&mut self) -> bool {
        self.teardown()
    }
}
