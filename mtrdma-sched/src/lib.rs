//! Pure per-tenant schedulers for RDMA work requests (no I/O, no RDMA).
