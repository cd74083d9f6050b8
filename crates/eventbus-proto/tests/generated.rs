//! The code in `src/generated/` is checked in, so that building this crate (and every
//! crate on it) needs no `protoc` and no code generator. This test holds it to the
//! proto: it generates the code again and compares. After a change to
//! `proto/eventbus/v1/eventbus.proto`, write the new code with
//!
//!     EVENTBUS_REGENERATE=1 cargo test -p eventbus-proto --test generated

use std::path::PathBuf;

/// What is generated, under `src/generated/`.
const FILES: [&str; 2] = ["eventbus.v1.rs", "eventbus_descriptor.bin"];

#[test]
fn the_checked_in_code_is_what_the_proto_generates() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // `proto/` is a link to the repository's proto/ (one source for every language).
    let root = manifest.join("proto");
    let out = tempfile::tempdir()?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        // Payloads are shared between subscribers, never copied.
        .bytes(".eventbus.v1")
        .out_dir(out.path())
        .file_descriptor_set_path(out.path().join(FILES[1]))
        .compile_with_config(config, &[root.join("eventbus/v1/eventbus.proto")], &[root])?;
    let kept = manifest.join("src/generated");
    let regenerate = std::env::var_os("EVENTBUS_REGENERATE").is_some();
    let mut stale = Vec::new();
    for file in FILES {
        let fresh = std::fs::read(out.path().join(file))?;
        if std::fs::read(kept.join(file)).ok().as_deref() == Some(fresh.as_slice()) {
            continue;
        }
        match regenerate {
            true => std::fs::write(kept.join(file), fresh)?,
            false => stale.push(file),
        }
    }
    assert!(
        stale.is_empty(),
        "{} in src/generated/ differ from what the proto generates: run \
         `EVENTBUS_REGENERATE=1 cargo test -p eventbus-proto --test generated` and commit the result",
        stale.join(" and ")
    );
    Ok(())
}
