//! Compiles the kubelet's own .proto files (proto/, copied unchanged from k8s.io/kubelet) into
//! the agent's gRPC servers and clients (the DRA mode's plugin and health services, the kubelet's
//! pod-resources API): protox parses them in Rust (no protoc on the build machine),
//! tonic-prost-build generates the code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/dra-health/v1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
