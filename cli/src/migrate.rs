//! `provisioning migrate-storage`: stores every object of a group's CRDs at its storage
//! version, then sets each CRD's `status.storedVersions` to that version alone (what
//! kube-storage-version-migrator does, and what allows a later release to stop serving an
//! old version: the API server refuses to drop a version still listed in storedVersions).
//!
//! Each object is read at the storage version and written back unchanged (PUT, with its
//! resourceVersion as precondition): the API server encodes a write at the storage version,
//! so an object stored at another version is stored again; one already at it is a no-op.
//! Works against the embedded control plane and any Kubernetes API server alike.

use anyhow::{Context as _, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};

/// Field manager of the rewrites.
pub const FIELD_MANAGER: &str = "provisioning-migrate-storage";
/// Objects per list page.
const PAGE: u32 = 200;
/// Tries per object when it keeps changing under the migration (409 Conflict).
const TRIES: usize = 5;

/// What the migration did to one CRD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The CRD's name (`servers.provisioning.dev`).
    pub crd: String,
    /// Its storage version.
    pub storage_version: String,
    /// Objects read and written back.
    pub objects: usize,
    /// `status.storedVersions` before.
    pub stored_before: Vec<String>,
}

/// `provisioning migrate-storage`: migrates, printing one line per CRD.
pub async fn run(client: &Client, group: &str) -> anyhow::Result<()> {
    for m in migrate_storage(client, group).await? {
        println!(
            "{}: {} objects stored at {}; storedVersions [{}] -> [{}]",
            m.crd,
            m.objects,
            m.storage_version,
            m.stored_before.join(", "),
            m.storage_version
        );
    }
    Ok(())
}

/// Migrates every CRD of `group` (each in turn); stops at the first CRD that cannot be
/// migrated completely, leaving its storedVersions untouched.
pub async fn migrate_storage(client: &Client, group: &str) -> anyhow::Result<Vec<Migrated>> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names: Vec<String> = crds
        .list(&ListParams::default())
        .await
        .context("listing CRDs")?
        .items
        .iter()
        .filter(|c| c.spec.group == group)
        .map(|c| c.name_any())
        .collect();
    if names.is_empty() {
        bail!("no CustomResourceDefinition of group {group} is installed");
    }
    names.sort();
    let mut done = vec![];
    for name in names {
        done.push(migrate_crd(client, &crds, &name).await.with_context(|| format!("migrating {name}"))?);
    }
    Ok(done)
}

async fn migrate_crd(client: &Client, crds: &Api<CustomResourceDefinition>, name: &str) -> anyhow::Result<Migrated> {
    let crd = crds.get(name).await?;
    let Some(storage) = crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone()) else {
        bail!("it has no storage version");
    };
    let stored_before = crd.status.as_ref().and_then(|s| s.stored_versions.clone()).unwrap_or_default();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &storage, &crd.spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut objects = 0;
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.context("listing objects")?;
        for obj in page.items {
            rewrite(client, &resource, obj).await?;
            objects += 1;
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    // Only now is nothing left at another version; the precondition (resourceVersion) makes
    // sure the storage version did not change meanwhile.
    let mut latest = crds.get(name).await?;
    if latest.spec.versions.iter().find(|v| v.storage).map(|v| v.name.as_str()) != Some(storage.as_str()) {
        bail!("its storage version changed during the migration; run it again");
    }
    if let Some(status) = latest.status.as_mut()
        && status.stored_versions.as_deref() != Some(std::slice::from_ref(&storage))
    {
        status.stored_versions = Some(vec![storage.clone()]);
        crds.replace_status(name, &PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &latest)
            .await
            .context("setting status.storedVersions (the CRD changed meanwhile? run it again)")?;
    }
    Ok(Migrated { crd: name.to_string(), storage_version: storage, objects, stored_before })
}

/// Writes one object back unchanged at the storage version; re-reads it on a conflict (it
/// changed meanwhile: that write stored it already, but a retry costs one call and proves it).
async fn rewrite(client: &Client, resource: &ApiResource, mut obj: DynamicObject) -> anyhow::Result<()> {
    let name = obj.name_any();
    let ns = obj.namespace();
    let api: Api<DynamicObject> = match &ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    let what = || format!("{}/{name}", ns.as_deref().map(|n| format!("{n}/")).unwrap_or_default());
    for _ in 0..TRIES {
        match api.replace(&name, &pp, &obj).await {
            Ok(_) => return Ok(()),
            // Deleted meanwhile: nothing left to migrate.
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&name).await? {
                Some(fresh) => obj = fresh,
                None => return Ok(()),
            },
            Err(e) => return Err(anyhow::Error::from(e).context(format!("writing back {}", what()))),
        }
    }
    bail!("{} kept changing ({TRIES} conflicts in a row); run the migration again", what())
}
