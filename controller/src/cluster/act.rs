//! Act: children by server-side apply (one field manager), deletes by name.

use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use provisioning_crds::{Server, TaskServ};

use super::plan::Plan;
use crate::context::{Context, FIELD_MANAGER};
use crate::error::Error;
use crate::slim::SlimApi;

/// Applies and deletes what the plan says. Deletes first (scale down frees names and quota),
/// then Servers, then TaskServs.
pub async fn act(plan: &Plan, namespace: &str, ctx: &Context) -> Result<(), Error> {
    let servers: Api<Server> = Api::namespaced(ctx.client.clone(), namespace);
    let taskservs: Api<TaskServ> = Api::namespaced(ctx.client.clone(), namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for name in &plan.delete_taskservs {
        delete(&taskservs, name).await?;
        ctx.metrics.record_write("TaskServ");
    }
    for name in &plan.delete_servers {
        delete(&servers, name).await?;
        ctx.metrics.record_write("Server");
    }
    // The answers are the live children, decoded slim (crate::slim): a tenant can make them large.
    let (apply_servers, apply_taskservs) =
        (SlimApi::of::<Server>(ctx.client.clone(), Some(namespace)), SlimApi::of::<TaskServ>(ctx.client.clone(), Some(namespace)));
    for server in &plan.apply_servers {
        let name = server.metadata.name.clone().ok_or(Error::MissingField("metadata.name"))?;
        apply_servers.patch(&name, &params, &Patch::Apply(server)).await?;
        ctx.metrics.record_write("Server");
    }
    for ts in &plan.apply_taskservs {
        let name = ts.metadata.name.clone().ok_or(Error::MissingField("metadata.name"))?;
        apply_taskservs.patch(&name, &params, &Patch::Apply(ts)).await?;
        ctx.metrics.record_write("TaskServ");
    }
    Ok(())
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
