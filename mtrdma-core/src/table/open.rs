//! Creating, opening and taking over a table, and removing its names.

use super::*;

impl QuotaTable {
    /// Creates the shared-memory table `name` with room for `capacity`
    /// tenants and `processes` attached processes, and publishes `policy`.
    ///
    /// The policy region is created with mode 0644 (only this process's
    /// user may write it), the state region with mode 0666.
    pub fn create(
        name: &str,
        capacity: u32,
        processes: u32,
        policy: &Policy,
    ) -> Result<TableOwner, TableError> {
        Self::create_named(name, capacity, processes, policy, (0o644, 0o666), 0).map(TableOwner::of)
    }

    /// Creates the table `name` for a coordinator: private to this
    /// process's user, and the table marked as kept by a
    /// coordinator, so that processes join it by registering (the
    /// coordinator hands them the table over its socket) and
    /// [`attach`](Self::attach) refuses to attach a process as a tenant of
    /// its choice.
    ///
    /// The policy is a named object (mode 0600). The state has no name:
    /// each tenant's is a memory file of its own, with `processes` process
    /// slots, sealed so that it can never shrink or grow, made when the
    /// tenant first takes a slot. The coordinator hands a registering
    /// process its tenant's file alone: a registered process can write
    /// its own tenant's counters (it keeps them there) but cannot reach
    /// another tenant's, nor truncate its own under its fellow processes'
    /// mappings, and no process the coordinator did not register can open
    /// any. Every holder keeps its file open; a restarted coordinator
    /// ([`take_over`](Self::take_over)) finds each again through a live
    /// holder's `/proc/PID/fd` entry, by the inode number the policy
    /// records.
    pub fn create_coordinated(
        name: &str,
        capacity: u32,
        processes: u32,
        policy: &Policy,
    ) -> Result<TableOwner, TableError> {
        check_name(name)?;
        check_split_sizes(capacity, processes)?;
        policy.validate()?;
        let (pname, _) = object_names(name);
        let pmap = Mapping::create(&pname, policy_len(capacity), 0o600)
            .map_err(|e| io_err("create", &pname, e))?;
        let table =
            Self::init_coordinated(Some(name.to_string()), pmap, capacity, processes, policy);
        if table.is_err() {
            let _ = shm::unlink(&pname);
        }
        table.map(TableOwner::of)
    }

    /// Marks the policy region `pmap` (sized for `capacity`) as a
    /// coordinated table's with `per_tenant` process slots per tenant file,
    /// and makes the table on it with no tenant file yet (publishing
    /// `policy` makes its tenants' files).
    pub(super) fn init_coordinated(
        name: Option<String>,
        pmap: Mapping,
        capacity: u32,
        per_tenant: u32,
        policy: &Policy,
    ) -> Result<QuotaTable, TableError> {
        // SAFETY: the header is all atomics, in bounds (the mapping was
        // sized from `capacity`).
        if let Some(h) = unsafe { pmap.get::<PolicyHeader>(0) } {
            h.segment_processes.store(per_tenant, Ordering::Relaxed);
            h.flags.store(TABLE_COORDINATED, Ordering::Relaxed);
        }
        let state = State::split(capacity, per_tenant, []);
        Self::init(name, pmap, state, capacity, capacity * per_tenant, policy)
    }

    pub(super) fn create_named(
        name: &str,
        capacity: u32,
        processes: u32,
        policy: &Policy,
        (pmode, smode): (u32, u32),
        flags: u64,
    ) -> Result<QuotaTable, TableError> {
        check_name(name)?;
        check_sizes(capacity, processes)?;
        policy.validate()?;
        let (pname, sname) = object_names(name);
        let pmap = Mapping::create(&pname, policy_len(capacity), pmode)
            .map_err(|e| io_err("create", &pname, e))?;
        let smap = match Mapping::create(&sname, state_len(capacity, processes), smode) {
            Ok(m) => m,
            Err(e) => {
                let _ = shm::unlink(&pname);
                return Err(io_err("create", &sname, e));
            }
        };
        let table = Self::init(
            Some(name.to_string()),
            pmap,
            State::Whole(smap),
            capacity,
            processes,
            policy,
        )
        .inspect(|t| t.policy_header().flags.store(flags, Ordering::Release));
        if table.is_err() {
            let _ = shm::unlink(&pname);
            let _ = shm::unlink(&sname);
        }
        table
    }

    /// A process-local table (no coordinator, no shared memory name) with
    /// the same API, sized for the policy's tenants (at least 64) and
    /// [`DEFAULT_PROCESSES`] process slots.
    pub fn embedded(policy: &Policy) -> Result<TableOwner, TableError> {
        let capacity = u32::try_from(policy.tenants.len())
            .unwrap_or(MAX_TENANTS)
            .clamp(64, MAX_TENANTS);
        Self::embedded_with_capacity(policy, capacity, DEFAULT_PROCESSES)
    }

    /// A process-local table with explicit sizes.
    pub fn embedded_with_capacity(
        policy: &Policy,
        capacity: u32,
        processes: u32,
    ) -> Result<TableOwner, TableError> {
        check_sizes(capacity, processes)?;
        policy.validate()?;
        let pmap = Mapping::anonymous(policy_len(capacity))
            .map_err(|e| io_err("mmap", "(embedded)", e))?;
        let smap = Mapping::anonymous(state_len(capacity, processes))
            .map_err(|e| io_err("mmap", "(embedded)", e))?;
        Self::init(None, pmap, State::Whole(smap), capacity, processes, policy).map(TableOwner::of)
    }

    pub(super) fn init(
        name: Option<String>,
        pmap: Mapping,
        state: State,
        capacity: u32,
        processes: u32,
        policy: &Policy,
    ) -> Result<QuotaTable, TableError> {
        // SAFETY: the header is all atomics; the mapping is writable and
        // was sized from `capacity`.
        let ph = unsafe { pmap.get::<PolicyHeader>(0) }.ok_or(TableError::Truncated {
            region: "policy",
            expected: POLICY_HEADER,
            actual: pmap.len(),
        })?;
        if let State::Whole(smap) = &state {
            // SAFETY: as above, for the state region.
            let sh = unsafe { smap.get::<StateHeader>(0) }.ok_or(TableError::Truncated {
                region: "state",
                expected: STATE_HEADER,
                actual: smap.len(),
            })?;
            sh.version.store(VERSION, Ordering::Relaxed);
            sh.header_size.store(STATE_HEADER as u32, Ordering::Relaxed);
            sh.capacity.store(capacity, Ordering::Relaxed);
            sh.slot_size.store(STATE_SLOT as u32, Ordering::Relaxed);
            sh.process_slots.store(processes, Ordering::Relaxed);
            sh.process_slot_size
                .store(PROCESS_SLOT as u32, Ordering::Relaxed);
            sh.magic.store(STATE_MAGIC, Ordering::Release);
        }
        ph.version.store(VERSION, Ordering::Relaxed);
        ph.header_size
            .store(POLICY_HEADER as u32, Ordering::Relaxed);
        ph.capacity.store(capacity, Ordering::Relaxed);
        ph.slot_size.store(POLICY_SLOT as u32, Ordering::Relaxed);
        if let Some(me) = ProcessId::current() {
            ph.coordinator_pid.store(me.pid, Ordering::Relaxed);
            ph.coordinator_start.store(me.start_time, Ordering::Relaxed);
        }
        let (raw0, ns0, mult) = SharedClock::calibrate();
        ph.clock_raw0.store(raw0, Ordering::Relaxed);
        ph.clock_ns0.store(ns0, Ordering::Relaxed);
        ph.clock_mult.store(mult, Ordering::Relaxed);
        ph.magic.store(POLICY_MAGIC, Ordering::Release);
        let clock = SharedClock::from_params(raw0, ns0, mult)
            .map_err(|problem| TableError::Clock { problem })?;
        let table = QuotaTable::on(name, pmap, state, capacity, processes, clock, 0);
        let owner = TableOwner::of(table);
        owner.publish(policy)?;
        Ok(owner.table)
    }

    /// Opens the table `name` as a tenant process: the policy region
    /// read-only, the state region read-write. Everything is validated.
    pub fn open(name: &str) -> Result<QuotaTable, TableError> {
        Self::open_mode(name, false)
    }

    /// Opens the table `name` with a writable policy region, as a restarted
    /// coordinator does to take over a table whose tenants are running.
    pub fn open_writable(name: &str) -> Result<TableOwner, TableError> {
        Self::open_mode(name, true).map(TableOwner::of)
    }

    /// Takes over the table `name` as a restarted coordinator: like
    /// [`open_writable`](Self::open_writable), after checking that both of
    /// its objects belong to this process's user and that no one else may
    /// open them ([`create_coordinated`](Self::create_coordinated) made
    /// them so). A table someone else created first, or one others may
    /// write, is refused ([`TableError::NotPrivate`]): taking it over would
    /// trust what they wrote and hand it to every tenant.
    ///
    /// Each tenant's state file is found through a live process that
    /// holds it (see [`create_coordinated`](Self::create_coordinated)); a
    /// tenant's file that no process holds any more (its processes and the
    /// old coordinator are gone) is made anew, empty, at the next
    /// [`publish`](TableOwner::publish): nothing in it was owed to anyone.
    pub fn take_over(name: &str) -> Result<TableOwner, TableError> {
        check_name(name)?;
        let (pname, _) = object_names(name);
        let me = rustix::process::geteuid().as_raw();
        let fd = shm::open_fd(&pname, true).map_err(|e| io_err("open", &pname, e))?;
        let (owner, mode) = shm::owner_and_mode(&fd).map_err(|e| io_err("fstat", &pname, e))?;
        if owner != me || mode & 0o077 != 0 {
            return Err(TableError::NotPrivate {
                object: pname,
                owner,
                mode,
                expected: me,
            });
        }
        let pmap = Mapping::from_fd(&fd, true).map_err(|e| io_err("mmap", &pname, e))?;
        let table = Self::with_state(name, pmap)?;
        if !table.is_coordinated() {
            return Err(TableError::NotPrivate {
                object: pname,
                owner: me,
                mode: 0o600,
                expected: me,
            });
        }
        Ok(TableOwner::of(table))
    }

    /// Maps a table from the objects a coordinator handed over: the policy
    /// read-only, the state read-write. Everything is validated.
    /// The tenant's state file is kept open for as long as the table is
    /// (see `create_coordinated`); it must be the file the policy records
    /// for its tenant slot, sealed.
    pub(crate) fn from_fds(
        name: &str,
        policy: &OwnedFd,
        state: OwnedFd,
    ) -> Result<QuotaTable, TableError> {
        let (pname, _) = object_names(name);
        let pmap = Mapping::from_fd(policy, false).map_err(|e| io_err("mmap", &pname, e))?;
        let (capacity, _) = validate_policy_region(&pmap)?;
        let per_tenant = split_processes(&pmap);
        if per_tenant == 0 {
            // Not a coordinated table: it has no state file per tenant.
            return Err(TableError::OutOfRange {
                region: "policy",
                field: "segment_processes".into(),
                value: 0,
                range: "1..=65536 on a coordinated table",
            });
        }
        let label = format!("mtrdma.{name}.tenant*");
        let seg = Self::segment_from_fd(&pmap, state, per_tenant, capacity, &label)?;
        let state = State::split(capacity, per_tenant, [seg]);
        Self::from_mappings(Some(name.to_string()), pmap, state)
    }

    /// Validates `fd` as a tenant's state file of the table whose policy
    /// is `pmap`: its header names a tenant slot and `per_tenant` process
    /// slots, its length fits, it is sealed, and it is the file (inode)
    /// the policy records for that slot.
    pub(super) fn segment_from_fd(
        pmap: &Mapping,
        fd: OwnedFd,
        per_tenant: u32,
        capacity: u32,
        label: &str,
    ) -> Result<Segment, TableError> {
        const R: &str = "tenant state";
        let map = Mapping::from_fd(&fd, true).map_err(|e| io_err("mmap", label, e))?;
        let slot = validate_segment(&map, per_tenant, capacity)?;
        let recorded =
            raw_policy_slot(pmap, slot).map_or(0, |s| s.state_inode.load(Ordering::Acquire));
        let inode = shm::inode(&fd).map_err(|e| io_err("fstat", label, e))?;
        if inode != recorded {
            return Err(TableError::Mismatch {
                region: R,
                field: "inode (the file the policy records for its tenant slot)",
                found: inode,
                expected: recorded,
            });
        }
        if !shm::sealed(&fd) {
            return Err(TableError::OutOfRange {
                region: R,
                field: "seals".into(),
                value: 0,
                range: "sealed against shrinking and growing",
            });
        }
        Ok(Segment { map, fd: Some(fd) })
    }

    /// The table's policy object opened read-only, as a coordinator hands
    /// it to every process it registers.
    pub(crate) fn policy_fd(&self) -> Result<OwnedFd, TableError> {
        let name = self.inner.name.as_deref().ok_or(TableError::ReadOnly)?;
        let (pname, _) = object_names(name);
        shm::open_fd(&pname, false).map_err(|e| io_err("open", &pname, e))
    }

    /// What else a coordinator hands a process it registers as `tenant`:
    /// that tenant's state file, and no other.
    pub(crate) fn tenant_state_fd(&self, tenant: TenantId) -> Result<OwnedFd, TableError> {
        let slot = self
            .snapshot()?
            .slot_of(tenant)
            .ok_or(TableError::UnknownTenant(tenant))?;
        let fd = self
            .segment(slot)
            .and_then(|seg| seg.fd.as_ref())
            .ok_or(TableError::UnknownTenant(tenant))?;
        let label = segment_label(self.inner.name.as_deref().unwrap_or(""), slot);
        fd.try_clone().map_err(|e| io_err("dup", &label, e))
    }

    pub(super) fn open_mode(name: &str, writable_policy: bool) -> Result<QuotaTable, TableError> {
        check_name(name)?;
        let (pname, _) = object_names(name);
        let pmap = Mapping::open(&pname, writable_policy).map_err(|e| io_err("open", &pname, e))?;
        Self::with_state(name, pmap)
    }

    /// Maps the state of table `name`, whose policy is `pmap`: the named
    /// object, or on a coordinated table each tenant's state file the
    /// policy records, found through a live process that holds it (one
    /// that no process holds stays unmapped); then validates everything.
    pub(super) fn with_state(name: &str, pmap: Mapping) -> Result<QuotaTable, TableError> {
        let per_tenant = split_processes(&pmap);
        if per_tenant == 0 {
            let (_, sname) = object_names(name);
            let smap = Mapping::open(&sname, true).map_err(|e| io_err("open", &sname, e))?;
            return Self::from_mappings(Some(name.to_string()), pmap, State::Whole(smap));
        }
        let (capacity, _) = validate_policy_region(&pmap)?;
        check_split_sizes(capacity, per_tenant)?;
        let wanted: HashMap<String, u64> = (0..capacity)
            .filter_map(|slot| {
                let inode = raw_policy_slot(&pmap, slot)?
                    .state_inode
                    .load(Ordering::Acquire);
                (inode != 0).then(|| (segment_label(name, slot), inode))
            })
            .collect();
        let mut found = shm::find_memfds(&wanted);
        let mut segments = Vec::with_capacity(found.len());
        for slot in 0..capacity {
            let label = segment_label(name, slot);
            let Some(fd) = found.remove(&label) else {
                continue;
            };
            match Self::segment_from_fd(&pmap, fd, per_tenant, capacity, &label) {
                Ok(seg) if seg.header().tenant_slot.load(Ordering::Relaxed) == slot => {
                    segments.push(seg);
                }
                Ok(_) => tracing::warn!(slot, "a tenant state file names another slot; left out"),
                Err(e) => {
                    tracing::warn!(slot, error = %e, "a tenant state file does not validate; left out")
                }
            }
        }
        let state = State::split(capacity, per_tenant, segments);
        Self::from_mappings(Some(name.to_string()), pmap, state)
    }

    /// A table on these regions, its cached policy an empty one of
    /// `generation` (0: the one to publish next; `u64::MAX`: none read yet).
    fn on(
        name: Option<String>,
        pmap: Mapping,
        state: State,
        capacity: u32,
        processes: u32,
        clock: SharedClock,
        generation: u64,
    ) -> QuotaTable {
        QuotaTable {
            inner: Arc::new(Inner {
                name,
                policy: pmap,
                state,
                capacity,
                processes,
                cache: ArcSwap::from_pointee(PolicySnapshot {
                    generation,
                    policy: Policy::new(LinkConfig::new(1), Vec::new()),
                    slots: HashMap::new(),
                    protections: HashMap::new(),
                }),
                clock,
            }),
        }
    }

    /// Validates two mapped regions and builds a table on them.
    pub(super) fn from_mappings(
        name: Option<String>,
        pmap: Mapping,
        state: State,
    ) -> Result<QuotaTable, TableError> {
        let (capacity, clock) = validate_policy_region(&pmap)?;
        let processes = match &state {
            State::Whole(smap) => validate_state_region(smap, capacity)?,
            State::Split { per_tenant, .. } => {
                check_split_sizes(capacity, *per_tenant)?;
                capacity * per_tenant
            }
        };
        let table = QuotaTable::on(name, pmap, state, capacity, processes, clock, u64::MAX);
        match table.snapshot() {
            Ok(_) => {}
            // A writer that died in the middle of publishing left the
            // policy half-written. Whoever opens it to write takes it over
            // and publishes a whole one (`publish` starts from an odd
            // sequence); tenants keep their last good policy until then.
            Err(TableError::Torn) if table.inner.policy.writable() => {
                tracing::warn!(
                    "the table's policy was left half-written by a writer that stopped; \
                     publish one to recover"
                );
            }
            Err(e) => return Err(e),
        }
        Ok(table)
    }

    /// Removes table `name`'s shared-memory objects. Processes that mapped
    /// them keep their mappings; new ones can no longer open it. (A
    /// coordinated table's state has no name: it goes with its last
    /// holder.)
    pub fn remove(name: &str) -> Result<(), TableError> {
        check_name(name)?;
        let (pname, sname) = object_names(name);
        let a = shm::unlink(&pname).map_err(|e| io_err("unlink", &pname, e));
        let b = match shm::unlink(&sname) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && a.is_ok() => Ok(()),
            b => b.map_err(|e| io_err("unlink", &sname, e)),
        };
        a.and(b)
    }
}

pub(super) fn check_sizes(capacity: u32, processes: u32) -> Result<(), TableError> {
    let in_range = |region, field: &str, value: u32, max| {
        if (1..=max).contains(&value) {
            Ok(())
        } else {
            Err(TableError::OutOfRange {
                region,
                field: field.into(),
                value: value.into(),
                range: "1..=65536",
            })
        }
    };
    in_range("policy", "capacity", capacity, MAX_TENANTS)?;
    in_range("state", "process_slots", processes, MAX_PROCESSES)
}

/// A coordinated table's sizes: `capacity` tenant files of `per_tenant`
/// process slots, whose process slots together fit in a `u32`.
pub(super) fn check_split_sizes(capacity: u32, per_tenant: u32) -> Result<(), TableError> {
    check_sizes(capacity, per_tenant)?;
    if u32::try_from(u64::from(capacity) * u64::from(per_tenant)).is_err() {
        return Err(TableError::OutOfRange {
            region: "policy",
            field: "segment_processes".into(),
            value: per_tenant.into(),
            range: "capacity x process slots per tenant below 2^32",
        });
    }
    Ok(())
}
