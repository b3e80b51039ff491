//! Errors of the quota table and of admission.

use std::io;

use crate::policy::PolicyError;
use crate::TenantId;

/// Why a quota table could not be created, opened or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// A shared-memory call failed.
    #[error("{op} of shared-memory object {object} failed: {source}{hint}")]
    Io {
        /// What was being done (`shm_open`, `mmap`, ...).
        op: &'static str,
        /// The object's name.
        object: String,
        /// The OS error.
        #[source]
        source: io::Error,
        /// What to do about it, if known.
        hint: &'static str,
    },
    /// A table name that cannot name a shared-memory object.
    #[error("invalid table name {0:?}: use 1 to 200 characters from [A-Za-z0-9_.-]")]
    BadName(String),
    /// The region is smaller than its header or its slots need.
    #[error("{region} region is truncated: {actual} bytes, at least {expected} needed")]
    Truncated {
        /// `policy` or `state`.
        region: &'static str,
        /// Bytes needed.
        expected: usize,
        /// Bytes there.
        actual: usize,
    },
    /// The region does not start with mtrdma's magic number: not a quota table.
    #[error("{region} region is not an mtrdma quota table (magic {found:#018x})")]
    BadMagic {
        /// `policy` or `state`.
        region: &'static str,
        /// The magic found.
        found: u64,
    },
    /// The table was written by an incompatible version of mtrdma.
    #[error("{region} region has layout version {found}; this mtrdma reads version {supported}")]
    UnsupportedVersion {
        /// `policy` or `state`.
        region: &'static str,
        /// The version found.
        found: u32,
        /// The version supported.
        supported: u32,
    },
    /// The two regions disagree, or the region does not have the capacity asked for.
    #[error("{region} region has {field} = {found}, expected {expected}")]
    Mismatch {
        /// `policy` or `state`.
        region: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        found: u64,
        /// The value expected.
        expected: u64,
    },
    /// A field holds a value outside its range.
    #[error("{region} region: {field} = {value} is out of range ({range})")]
    OutOfRange {
        /// `policy` or `state`.
        region: &'static str,
        /// The field (with the slot, where there is one).
        field: String,
        /// The value found.
        value: u64,
        /// The valid range.
        range: &'static str,
    },
    /// The policy stored in the table does not validate.
    #[error("the policy stored in the table is invalid: {0}")]
    InvalidPolicy(#[from] PolicyError),
    /// The table's clock calibration cannot be used in this process.
    #[error("the table's shared clock cannot be used here: {problem}")]
    Clock {
        /// What is wrong.
        problem: String,
    },
    /// The policy was being rewritten for too long (its writer may have died mid-write).
    #[error(
        "the policy region stayed mid-update; its writer may have died while writing \
         (the last consistent policy stays in use; restart the coordinator)"
    )]
    Torn,
    /// The policy holds more tenants than the table has slots.
    #[error("the policy has {tenants} tenants but the table has room for {capacity}")]
    Full {
        /// Tenants in the policy.
        tenants: usize,
        /// Slots in the table.
        capacity: u32,
    },
    /// The table has no name to hand its policy out by (an embedded one).
    #[error("this table has no shared policy object to hand out (an embedded table)")]
    ReadOnly,
    /// A coordinator keeps this table: processes join it by registering.
    #[error(
        "a coordinator keeps this table: join it with `coordinator::register(socket)`, \
         which decides the tenant from this process's credentials, rather than attaching \
         as a tenant of your choice"
    )]
    Coordinated,
    /// A table's shared-memory object is not private to this user: someone
    /// else created it (or an older mtrdma, or a table made without a
    /// coordinator), and taking it over would trust what they wrote.
    #[error(
        "shared-memory object {object} belongs to uid {owner} with mode {mode:o}; a coordinator \
         only takes over a table of its own user (uid {expected}) that no one else can open: \
         if no coordinator runs, remove it (`rm /dev/shm{object}`, or QuotaTable::remove) and start again"
    )]
    NotPrivate {
        /// The object's name.
        object: String,
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
        /// The uid that must own it.
        expected: u32,
    },
    /// The tenant is not in the table's policy.
    #[error("{0} is not in the table's policy")]
    UnknownTenant(TenantId),
    /// Every process slot is held by a live process.
    #[error("all {0} process slots of the table are in use by live processes")]
    NoProcessSlot(u32),
    /// A process slot handed out by the coordinator does not belong to this process.
    #[error("process slot {slot} does not belong to this process ({reason})")]
    NotOurSlot {
        /// The slot.
        slot: u32,
        /// What did not match.
        reason: String,
    },
}

/// A control-path or data-path request the tenant's quota refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// The request would take the tenant above a limit.
    #[error(
        "{tenant} ({name}) is at its {resource} quota: limit {limit}, in use {in_use}, \
         requested {requested}; release some or raise {field} in the policy"
    )]
    QuotaExceeded {
        /// The tenant.
        tenant: TenantId,
        /// Its name.
        name: String,
        /// `queue pairs`, `memory-region bytes`, `outstanding work requests`.
        resource: &'static str,
        /// The policy field that sets the limit.
        field: &'static str,
        /// The limit.
        limit: u64,
        /// What is in use now (across all the tenant's processes).
        in_use: u64,
        /// What was asked for.
        requested: u64,
    },
    /// The request exceeds a control-path rate (QP creations/s, MR registrations/s).
    #[error(
        "{tenant} ({name}) exceeds its {operation} rate of {per_second}/s; retry in {retry_after_ns} ns"
    )]
    RateLimited {
        /// The tenant.
        tenant: TenantId,
        /// Its name.
        name: String,
        /// `QP creation` or `MR registration`.
        operation: &'static str,
        /// The rate limit.
        per_second: u64,
        /// How long until the request would conform.
        retry_after_ns: u64,
    },
}
