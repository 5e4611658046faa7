//! Writes the node's ResourceSlices when they differ from what the API server holds: server-side
//! apply of each slice at the next pool generation, then deletes of slices the pool no longer has.
//! Nothing is written when nothing changed.

use super::devices::{DRIVER, DraDevice};
use super::slices::{NodeOwner, difference, slices};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch};
use kube::{Client, ResourceExt};

/// What a publish did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Slices written (applied or deleted); 0 when nothing changed.
    pub writes: usize,
    pub generation: i64,
}

/// Makes the API server's slices of `node` say `devices`, owned by its Node when known.
pub async fn publish(
    client: &Client,
    node: &str,
    owner: Option<&NodeOwner>,
    devices: &[DraDevice],
) -> Result<Published, kube::Error> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let live = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}")))
        .await?
        .items;
    let current = live.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
    let Some(why) = difference(&live, &slices(node, owner, devices, current)) else {
        return Ok(Published {
            writes: 0,
            generation: current,
        });
    };
    tracing::debug!(node, %why, "the ResourceSlices differ from the devices");
    let generation = current + 1;
    let want = slices(node, owner, devices, generation);
    let pp = crate::runtime::client::apply_params(crate::agent::field_manager::FIELD_MANAGER);
    let mut writes = 0;
    for s in &want {
        api.patch(&s.name_any(), &pp, &Patch::Apply(s)).await?;
        writes += 1;
    }
    for old in live
        .iter()
        .filter(|l| !want.iter().any(|w| w.name_any() == l.name_any()))
    {
        match api.delete(&old.name_any(), &DeleteParams::default()).await {
            Ok(_) => writes += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Published { writes, generation })
}
