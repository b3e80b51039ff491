//! `libmtrdma_preload.so`: unmodified libibverbs programs (perftest,
//! `ibv_rc_pingpong`, your C services) under mtrdma's isolation, with no
//! change to the program and no fork of rdma-core.
//!
//! ```text
//! MTRDMA_COORDINATOR=/run/mtrdma.sock LD_PRELOAD=libmtrdma_preload.so ib_write_bw ...
//! MTRDMA_POLICY=policy.toml MTRDMA_TENANT=bulk LD_PRELOAD=libmtrdma_preload.so ib_write_bw ...
//! ```
//!
//! With `MTRDMA_COORDINATOR` the program registers with a running
//! coordinator, which decides its tenant from its credentials (cgroup,
//! uid, gid) as for Rust tenants; with `MTRDMA_POLICY` (and
//! `MTRDMA_TENANT` when the policy has several tenants) it runs on an
//! embedded quota table of its own. See [`tenant`] for what happens when
//! neither is set or the tenant cannot be joined.
//!
//! The control path ([`control`]): `ibv_create_qp`, `ibv_create_qp_ex`,
//! `ibv_destroy_qp`, `ibv_reg_mr`, `ibv_reg_mr_iova`, `ibv_reg_mr_iova2`,
//! `ibv_reg_dmabuf_mr`, `ibv_rereg_mr` and `ibv_dereg_mr` are admitted
//! against the tenant's quota with the same rules and rate limits as the
//! Rust API; a refusal returns what libibverbs returns for such a failure
//! (a null pointer and `errno`) and says once on stderr which limit
//! refused it and how to raise it.
//!
//! How it is built:
//! - Every real libibverbs function is reached with `dlvsym(RTLD_NEXT)`
//!   ([`ffi`]); the library never calls libibverbs through its own link
//!   (a device test checks that it imports no `ibv_` symbol).
//! - No panic unwinds into C: every entry point catches it and returns the
//!   C error (`EIO`).
//! - The C structures it touches are declared in [`ffi`] and checked at
//!   compile time against the installed rdma-core headers (`build.rs`
//!   reads their layout with a small C program).
//! - Functions the headers inline (`ibv_create_qp_ex`) are reached through
//!   the context's tables, taken over when the program opens a device
//!   ([`context`]).

mod context;
pub mod control;
pub mod datapath;
mod ex;
pub mod exports;
pub mod ffi;
mod guard;
pub mod tenant;

pub use tenant::{ENV_COORDINATOR, ENV_POLICY, ENV_TENANT};
