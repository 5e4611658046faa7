//! The generated code of the kubelet's .proto files whose packages are bare versions (build.rs):
//! `v1` holds both the pod-resources API and the v1 `DRAResourceHealth` service (both files say
//! `package v1;`), `v1alpha1` the older health service.

pub mod v1 {
    tonic::include_proto!("v1");
}

pub mod v1alpha1 {
    tonic::include_proto!("v1alpha1");
}
