//! Generates the `eventbus.v1` types with a vendored `protoc`, so no system install is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // `proto/` here is a link to the repository's proto/ (one source for every
    // language); `cargo package` copies the files it links to, so a packaged crate
    // carries the proto it builds from.
    // Read when the script runs, not compiled in: a build script built in another
    // checkout of the same workspace may be reused here.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let proto = root.join("eventbus/v1/eventbus.proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Behind a link, where cargo does not look for changes by itself.
    println!("cargo:rerun-if-changed={}", proto.display());

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        // Payloads are shared between subscribers, never copied.
        .bytes(".eventbus.v1")
        .file_descriptor_set_path(out.join("eventbus_descriptor.bin"))
        .compile_with_config(config, &[proto], &[root])?;
    Ok(())
}
