//! Compiles the wire contract with protox (pure Rust), so no `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "flotilla/v1/types.proto",
        "flotilla/v1/agent.proto",
        "flotilla/v1/view.proto",
        "flotilla/v1/ledger.proto",
        "flotilla/v1/routes.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
