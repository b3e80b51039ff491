//! Lists the RDMA devices of this host, their ports and GID tables, and the
//! GID mtrdma would choose for each active port.
//!
//! ```text
//! cargo run --example devices
//! ```

use mtrdma::verbs::{device_names, Context, GidSelection, PortState};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let names = device_names()?;
    if names.is_empty() {
        return Err(mtrdma::verbs::Error::NoDevice.into());
    }
    for name in names {
        let ctx = Context::open(&name)?;
        println!("{name}: {} port(s)", ctx.port_count());
        for port in ctx.ports()? {
            let mtu = port
                .active_mtu
                .map_or_else(|| "-".to_string(), |m| m.to_string());
            println!(
                "  port {}: {}, link layer {}, active MTU {mtu}, {} GID entries",
                port.number, port.state, port.link_layer, port.gid_table_len
            );
            if port.state != PortState::Active {
                continue;
            }
            for g in ctx.gids(port.number)? {
                println!(
                    "    GID[{:>3}] {:<40} {}",
                    g.index,
                    g.gid.to_string(),
                    g.kind
                );
            }
            match ctx.select_gid(port.number, GidSelection::Auto) {
                Ok(g) => println!("    mtrdma uses GID index {} ({})", g.index, g.gid),
                Err(e) => println!("    no usable GID: {e}"),
            }
        }
    }
    Ok(())
}
