//! Generated code for the Socle EventBus wire API (`proto/eventbus/v1/eventbus.proto`).
//!
//! Everything generated lives under [`pb`]; the `.proto` file is the reference
//! documentation. The generated code is checked in (`src/generated/`, held to the proto
//! by `tests/generated.rs`), so building needs neither `protoc` nor a code generator. [`time`] checks the times requests carry, as the wire type defines them.

pub mod time;

/// The `eventbus.v1` package: messages, client stubs and server traits.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic, missing_debug_implementations)]
pub mod pb {
    include!("generated/eventbus.v1.rs");

    /// Encoded `FileDescriptorSet` of the API, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/eventbus_descriptor.bin");
}
