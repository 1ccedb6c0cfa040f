//! Compiles the .proto files with protox (a protobuf compiler in pure Rust, so
//! no `protoc` is needed) and generates the Rust with tonic-prost-build.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["grove/v1/grove.proto", "grove/runner/v1/runner.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["."])?;
    // The descriptor set is also embedded, for gRPC reflection.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("grove_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Its Debug (in lib.rs) hides the token.
        .skip_debug(["grove.v1.HubSettings"])
        .compile_fds(descriptors)?;
    Ok(())
}
