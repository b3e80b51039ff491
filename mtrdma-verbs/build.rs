//! With the `rdmacm` feature: generates the bindings to librdmacm's
//! `rdma/rdma_cma.h` (connections by address) with bindgen, as
//! `ibverbs-sys` generates its own, its verbs types taken from
//! `ibverbs-sys` rather than generated twice, and links librdmacm.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_RDMACM");
    if std::env::var_os("CARGO_FEATURE_RDMACM").is_some() {
        #[cfg(feature = "rdmacm")]
        rdmacm();
    }
}

#[cfg(feature = "rdmacm")]
fn rdmacm() {
    println!("cargo:rustc-link-lib=rdmacm");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header_contents("rdmacm.h", "#include <rdma/rdma_cma.h>\n")
        .allowlist_function("rdma_.*")
        .allowlist_type("rdma_.*")
        .allowlist_var("RDMA_.*")
        // The verbs types are ibverbs-sys's (its enums of constants in
        // modules, as it makes them); the path record, known only by
        // pointer, is opaque.
        .blocklist_type("ibv_.*")
        .raw_line("use ibverbs_sys::*;")
        .raw_line("#[repr(C)] pub struct ibv_sa_path_rec { _opaque: [u8; 0] }")
        .constified_enum_module("ibv_qp_type")
        .constified_enum_module("ibv_qp_state")
        .constified_enum_module("ibv_wc_opcode")
        .constified_enum_module("ibv_wr_opcode")
        .constified_enum_module("ibv_wc_status")
        .constified_enum_module("rdma_cm_event_type")
        .constified_enum_module("rdma_port_space")
        .derive_default(true)
        .derive_debug(false)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "generating the bindings to <rdma/rdma_cma.h> failed ({e}); the rdmacm feature \
                 needs librdmacm's headers (Debian: librdmacm-dev; `cargo xtask deps`)"
            )
        });
    bindings
        .write_to_file(out.join("rdmacm.rs"))
        .expect("writing the rdma_cm bindings");
}
