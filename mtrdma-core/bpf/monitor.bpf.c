// SPDX-License-Identifier: MIT OR Apache-2.0 OR GPL-2.0-only
//
// The kernel side of mtrdma's monitor (mtrdma_core::monitor): kprobes on
// the RDMA core's functions that every user-space verbs path reaches,
// counting per cgroup and process the queue pairs created and destroyed,
// their state changes, and the memory regions registered and deregistered
// with their bytes. Driver-independent (the RDMA core, ib_core and
// ib_uverbs, not a provider), so it sees rxe and mlx5 alike; sizes come
// from function arguments, never from kernel structures, so no headers of
// the running kernel's build are needed.
//
// Each object is counted once, on success: a queue pair when
// ib_create_qp_user returns one (the write and the ioctl paths both call
// it), a region when ib_uverbs_reg_mr returns 0 (its bytes are the length
// its ib_umem_get pinned), and each is remembered by its kernel address
// with the process that made it, so that its destruction is counted for
// that process whoever runs it (a dying process's objects are destroyed as
// its files close).
//
// Built with `clang -target bpf -O2` (mtrdma-core/build.rs); x86-64 only
// (the register layout below).

typedef unsigned char __u8;
typedef unsigned int __u32;
typedef unsigned long long __u64;

#define SEC(name) __attribute__((section(name), used))
#define INLINE static inline __attribute__((always_inline))

// The kernel's struct pt_regs on x86-64: a kprobe's context. The first
// three arguments of a function are in di, si and dx, the fourth in cx;
// its return value is in ax.
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx;
	unsigned long r11, r10, r9, r8, ax, cx, dx, si, di;
	unsigned long orig_ax;
	unsigned long ip, cs, flags, sp, ss;
};

// Helper numbers of the BPF ABI (enum bpf_func_id in <linux/bpf.h>).
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value,
				   __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static __u64 (*bpf_get_current_uid_gid)(void) = (void *)15;
static __u64 (*bpf_get_current_cgroup_id)(void) = (void *)80;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *src) = (void *)113;

#define BPF_MAP_TYPE_HASH 1
#define BPF_NOEXIST 1

// A legacy map definition (the "maps" section), which every loader reads.
struct bpf_map_def {
	__u32 type;
	__u32 key_size;
	__u32 value_size;
	__u32 max_entries;
	__u32 map_flags;
};

// Who made an object: the cgroup (v2) id and the process (thread group).
// The layout is mtrdma_core::monitor's Owner.
struct owner {
	__u64 cgroup;
	__u32 tgid;
	__u32 pad;
};

// What one process did (mtrdma_core::monitor's RawCounts).
struct counts {
	__u64 qps_created;
	__u64 qps_destroyed;
	__u64 qp_state_changes;
	__u64 qps_to_rts;
	__u64 mrs_registered;
	__u64 mrs_deregistered;
	__u64 mr_bytes_registered;
	__u64 mr_bytes_released;
	__u32 uid;
	__u32 gid;
};

// A registered region: who made it and its length.
struct region {
	struct owner owner;
	__u64 bytes;
};

// A call in progress on one thread, between its entry and its return.
enum call { CALL_DESTROY_QP = 1, CALL_MODIFY_QP = 2, CALL_REG_MR = 3 };
struct call_key {
	__u64 pid_tgid;
	__u32 call;
	__u32 pad;
};
struct call_state {
	__u64 object;	// the queue pair, or the region's pinned memory
	__u64 bytes;	// the region's length
	__u32 state;	// the state a modify asks for
	__u32 pad;
};

#define MAX_PROCESSES 16384
#define MAX_OBJECTS 262144
#define MAX_CALLS 4096

struct bpf_map_def SEC("maps") COUNTS = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(struct owner),
	.value_size = sizeof(struct counts),
	.max_entries = MAX_PROCESSES,
};
// Queue pairs made by user space, by kernel address.
struct bpf_map_def SEC("maps") QPS = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u64),
	.value_size = sizeof(struct owner),
	.max_entries = MAX_OBJECTS,
};
// Registered regions, by the address of their pinned memory (ib_umem).
struct bpf_map_def SEC("maps") MRS = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u64),
	.value_size = sizeof(struct region),
	.max_entries = MAX_OBJECTS,
};
struct bpf_map_def SEC("maps") CALLS = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(struct call_key),
	.value_size = sizeof(struct call_state),
	.max_entries = MAX_CALLS,
};

// The IB_QP_STATE bit of a modify's attribute mask, and IB_QPS_RTS.
#define IB_QP_STATE 1
#define IB_QPS_RTS 3
#define MAX_ERRNO 4095

INLINE int is_err_or_null(__u64 ptr)
{
	return ptr == 0 || ptr >= (__u64)-MAX_ERRNO;
}

INLINE struct owner current_owner(void)
{
	struct owner o = {};
	o.cgroup = bpf_get_current_cgroup_id();
	o.tgid = bpf_get_current_pid_tgid() >> 32;
	return o;
}

// The counters of `o`, made (with the current process's ids) if new.
INLINE struct counts *counts_of(struct owner *o)
{
	struct counts *c = bpf_map_lookup_elem(&COUNTS, o);
	if (c)
		return c;
	struct counts fresh = {};
	__u64 ids = bpf_get_current_uid_gid();
	fresh.uid = (__u32)ids;
	fresh.gid = ids >> 32;
	bpf_map_update_elem(&COUNTS, o, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&COUNTS, o);
}

INLINE struct call_key call_key(__u32 call)
{
	struct call_key k = {};
	k.pid_tgid = bpf_get_current_pid_tgid();
	k.call = call;
	return k;
}

INLINE void begin(__u32 call, __u64 object, __u32 state)
{
	struct call_key k = call_key(call);
	struct call_state s = {};
	s.object = object;
	s.state = state;
	bpf_map_update_elem(&CALLS, &k, &s, 0);
}

// The call's state, taken out; returns 0 when none was begun.
INLINE int end(__u32 call, struct call_state *out)
{
	struct call_key k = call_key(call);
	struct call_state *s = bpf_map_lookup_elem(&CALLS, &k);
	if (!s)
		return 0;
	*out = *s;
	bpf_map_delete_elem(&CALLS, &k);
	return 1;
}

// The process that made queue pair `qp`, into `out`; 0 if the monitor did
// not see it made.
INLINE int qp_owner(__u64 qp, struct owner *out)
{
	struct owner *made_by = bpf_map_lookup_elem(&QPS, &qp);
	if (!made_by)
		return 0;
	*out = *made_by;
	return 1;
}

// struct ib_qp *ib_create_qp_user(struct ib_device *, struct ib_pd *,
//     struct ib_qp_init_attr *, struct ib_udata *, struct ib_uqp_object *,
//     const char *caller): user space's queue pairs, both paths.
SEC("kretprobe/ib_create_qp_user")
int qp_created(struct pt_regs *ctx)
{
	__u64 qp = ctx->ax;
	if (is_err_or_null(qp))
		return 0;
	struct owner o = current_owner();
	bpf_map_update_elem(&QPS, &qp, &o, 0);
	struct counts *c = counts_of(&o);
	if (c)
		__sync_fetch_and_add(&c->qps_created, 1);
	return 0;
}

// int ib_destroy_qp_user(struct ib_qp *qp, struct ib_udata *udata)
SEC("kprobe/ib_destroy_qp_user")
int qp_destroy_begins(struct pt_regs *ctx)
{
	begin(CALL_DESTROY_QP, ctx->di, 0);
	return 0;
}

SEC("kretprobe/ib_destroy_qp_user")
int qp_destroyed(struct pt_regs *ctx)
{
	struct call_state s;
	if (!end(CALL_DESTROY_QP, &s) || (int)ctx->ax != 0)
		return 0;
	struct owner o;
	if (!qp_owner(s.object, &o))
		return 0;
	bpf_map_delete_elem(&QPS, &s.object);
	struct counts *c = counts_of(&o);
	if (c)
		__sync_fetch_and_add(&c->qps_destroyed, 1);
	return 0;
}

// int ib_modify_qp_with_udata(struct ib_qp *qp, struct ib_qp_attr *attr,
//     int attr_mask, struct ib_udata *udata): the new state is the first
// field of struct ib_qp_attr.
SEC("kprobe/ib_modify_qp_with_udata")
int qp_modify_begins(struct pt_regs *ctx)
{
	if (!(ctx->dx & IB_QP_STATE))
		return 0;
	__u32 state = 0;
	if (bpf_probe_read_kernel(&state, sizeof(state), (void *)ctx->si) != 0)
		return 0;
	begin(CALL_MODIFY_QP, ctx->di, state);
	return 0;
}

SEC("kretprobe/ib_modify_qp_with_udata")
int qp_modified(struct pt_regs *ctx)
{
	struct call_state s;
	if (!end(CALL_MODIFY_QP, &s) || (int)ctx->ax != 0)
		return 0;
	struct owner o;
	if (!qp_owner(s.object, &o))
		return 0;
	struct counts *c = counts_of(&o);
	if (!c)
		return 0;
	__sync_fetch_and_add(&c->qp_state_changes, 1);
	if (s.state == IB_QPS_RTS)
		__sync_fetch_and_add(&c->qps_to_rts, 1);
	return 0;
}

// static int ib_uverbs_reg_mr(struct uverbs_attr_bundle *attrs): the
// command behind ibv_reg_mr. Its region's memory is pinned by the
// driver's ib_umem_get inside it.
SEC("kprobe/ib_uverbs_reg_mr")
int mr_reg_begins(struct pt_regs *ctx)
{
	begin(CALL_REG_MR, 0, 0);
	return 0;
}

// struct ib_umem *ib_umem_get(struct ib_device *, unsigned long addr,
//     size_t size, int access)
SEC("kprobe/ib_umem_get")
int mr_pin_begins(struct pt_regs *ctx)
{
	struct call_key k = call_key(CALL_REG_MR);
	struct call_state *s = bpf_map_lookup_elem(&CALLS, &k);
	if (s)
		s->bytes = ctx->dx;
	return 0;
}

SEC("kretprobe/ib_umem_get")
int mr_pinned(struct pt_regs *ctx)
{
	struct call_key k = call_key(CALL_REG_MR);
	struct call_state *s = bpf_map_lookup_elem(&CALLS, &k);
	if (s && !is_err_or_null(ctx->ax))
		s->object = ctx->ax;
	return 0;
}

SEC("kretprobe/ib_uverbs_reg_mr")
int mr_registered(struct pt_regs *ctx)
{
	struct call_state s;
	if (!end(CALL_REG_MR, &s) || (int)ctx->ax != 0 || s.object == 0)
		return 0;
	struct region r = {};
	r.owner = current_owner();
	r.bytes = s.bytes;
	bpf_map_update_elem(&MRS, &s.object, &r, 0);
	struct counts *c = counts_of(&r.owner);
	if (!c)
		return 0;
	__sync_fetch_and_add(&c->mrs_registered, 1);
	__sync_fetch_and_add(&c->mr_bytes_registered, r.bytes);
	return 0;
}

// void ib_umem_release(struct ib_umem *umem): a registered region's
// memory let go (its deregistration, or its owner's exit).
SEC("kprobe/ib_umem_release")
int mr_released(struct pt_regs *ctx)
{
	__u64 umem = ctx->di;
	struct region *found = bpf_map_lookup_elem(&MRS, &umem);
	if (!found)
		return 0;
	struct region r = *found;
	bpf_map_delete_elem(&MRS, &umem);
	struct counts *c = counts_of(&r.owner);
	if (!c)
		return 0;
	__sync_fetch_and_add(&c->mrs_deregistered, 1);
	__sync_fetch_and_add(&c->mr_bytes_released, r.bytes);
	return 0;
}

// The kernel lets GPL-compatible programs use bpf_probe_read_kernel.
char LICENSE[] SEC("license") = "Dual MIT/GPL";
