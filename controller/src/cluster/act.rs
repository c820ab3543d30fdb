//! Act: children by server-side apply (one field manager), deletes by name.

use kube::api::{Patch, PatchParams};
use provisioning_crds::{Server, TaskServ};

use super::plan::Plan;
use crate::context::{Context, FIELD_MANAGER};
use crate::error::Error;
use crate::slim::SlimApi;

/// Applies and deletes what the plan says. Deletes first (scale down frees names and quota),
/// then Servers, then TaskServs.
pub async fn act(plan: &Plan, namespace: &str, ctx: &Context) -> Result<(), Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    // Every answer is the live child, decoded slim (crate::slim): a tenant can make it large.
    let (servers, taskservs) =
        (SlimApi::of::<Server>(ctx.client.clone(), Some(namespace)), SlimApi::of::<TaskServ>(ctx.client.clone(), Some(namespace)));
    for name in &plan.delete_taskservs {
        delete(&taskservs, name).await?;
        ctx.metrics.record_write("TaskServ");
    }
    for name in &plan.delete_servers {
        delete(&servers, name).await?;
        ctx.metrics.record_write("Server");
    }
    for server in &plan.apply_servers {
        let name = server.metadata.name.clone().ok_or(Error::MissingField("metadata.name"))?;
        servers.patch(&name, &params, &Patch::Apply(server)).await?;
        ctx.metrics.record_write("Server");
    }
    for ts in &plan.apply_taskservs {
        let name = ts.metadata.name.clone().ok_or(Error::MissingField("metadata.name"))?;
        taskservs.patch(&name, &params, &Patch::Apply(ts)).await?;
        ctx.metrics.record_write("TaskServ");
    }
    Ok(())
}

/// Deletes a child; the answer (the member, still there while finalizers run) decoded slim.
async fn delete(api: &SlimApi, name: &str) -> Result<(), Error> {
    match api.delete(name).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
