//! Generated code for the Socle EventBus wire API (`proto/eventbus/v1/eventbus.proto`).
//!
//! Everything generated lives under [`pb`]; the `.proto` file is the reference
//! documentation. [`time`] checks the times requests carry, as the wire type defines them.

pub mod time;

/// The `eventbus.v1` package: messages, client stubs and server traits.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("eventbus.v1");

    /// Encoded `FileDescriptorSet` of the API, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("eventbus_descriptor");
}
