//! What each page reads, with the visitor's client, and how it is drawn: the same function
//! serves the first render and every live update, so both always agree.

use chrono::Utc;
use serde_json::Value;

use super::api::{self, ApiFailure, Kind};
use super::render::{self, Allowed, ObjectView, Section};
use super::session::{ReadyPoint, Session};
use crate::trace::{self, Root};

/// A page of the console.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Page {
    /// `/`: every Workspace.
    Workspaces,
    /// `/workspaces/NAME`, or `/namespaces/NS/PLURAL/NAME` for the namespaced kinds.
    Object {
        /// Kind.
        kind: Kind,
        /// Namespace (None for a Workspace).
        namespace: Option<String>,
        /// Name.
        name: String,
    },
}

/// Whether `s` is a plausible Kubernetes object or namespace name (DNS subdomain characters).
pub fn valid_name(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ends_ok = s.bytes().next().is_some_and(alnum) && s.bytes().last().is_some_and(alnum);
    ends_ok && s.len() <= 253 && s.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
}

impl Page {
    /// The page at `path`, if any (names checked, so they are safe in links and API paths).
    pub fn parse(path: &str) -> Option<Page> {
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        match parts.as_slice() {
            [] | [""] => Some(Page::Workspaces),
            ["workspaces", name] if valid_name(name) => {
                Some(Page::Object { kind: Kind::Workspace, namespace: None, name: name.to_string() })
            }
            ["namespaces", ns, plural, name] if valid_name(ns) && valid_name(name) => {
                let kind = Kind::from_plural(plural).filter(|k| *k != Kind::Workspace)?;
                Some(Page::Object { kind, namespace: Some(ns.to_string()), name: name.to_string() })
            }
            _ => None,
        }
    }

    /// The page's path.
    pub fn path(&self) -> String {
        match self {
            Page::Workspaces => "/".into(),
            Page::Object { kind, namespace, name } => render::object_path(*kind, namespace.as_deref(), name),
        }
    }

    /// Heading and breadcrumbs.
    pub fn title(&self) -> (String, Vec<(String, String)>) {
        match self {
            Page::Workspaces => ("Workspaces".into(), vec![]),
            Page::Object { kind, namespace, name } => {
                let mut crumbs = vec![];
                if let Some(ns) = namespace {
                    // Plain text: the Workspace that claims a namespace may have another name.
                    crumbs.push((format!("namespace {ns}"), String::new()));
                }
                crumbs.push((format!("{} {name}", kind.name()), self.path()));
                (format!("{} {name}", kind.name()), crumbs)
            }
        }
    }
}

/// The namespace a Workspace owns (spec.namespace, else its name), from its JSON.
pub fn workspace_namespace(ws: &Value) -> String {
    ws["status"]["namespace"]
        .as_str()
        .or_else(|| ws["spec"]["namespace"].as_str())
        .filter(|s| !s.is_empty())
        .or_else(|| ws["metadata"]["name"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The namespaces of `servers` that no Workspace of `workspaces` covers, with their Server counts.
fn unclaimed_namespaces(workspaces: &[Value], servers: &[Value]) -> Vec<(String, usize)> {
    let claimed: std::collections::BTreeSet<String> = workspaces.iter().map(workspace_namespace).collect();
    let mut out: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for ns in servers.iter().filter_map(|s| s["metadata"]["namespace"].as_str()) {
        if !claimed.contains(ns) {
            *out.entry(ns.to_string()).or_default() += 1;
        }
    }
    out.into_iter().collect()
}

/// A section's data, or why the visitor may not see it; a 401 ends the page.
fn section(r: Result<Vec<Value>, ApiFailure>) -> Result<Section, ApiFailure> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(ApiFailure::Unauthorized) => Err(ApiFailure::Unauthorized),
        Err(ApiFailure::Forbidden(_)) => Ok(Err("your token may not read them".into())),
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// Whether the visitor may patch, approve and delete the object.
pub async fn allowed(session: &Session, kind: Kind, namespace: Option<&str>, name: &str) -> Result<Allowed, ApiFailure> {
    let (patch, approve, delete) = futures::try_join!(
        api::may(&session.client, "patch", kind, namespace, name),
        api::may(&session.client, api::APPROVE_VERB, kind, namespace, name),
        api::may(&session.client, "delete", kind, namespace, name)
    )?;
    Ok(Allowed { patch, approve, delete })
}

/// The live part of `page`, read with the visitor's token.
pub async fn live_fragment(session: &Session, page: &Page) -> Result<String, ApiFailure> {
    let now = Utc::now();
    let client = &session.client;
    let Page::Object { kind, namespace, name } = page else {
        let mut list = api::list(client, Kind::Workspace, None).await?;
        list.sort_by(|a, b| a["metadata"]["name"].as_str().cmp(&b["metadata"]["name"].as_str()));
        // Namespaces whose Servers no Workspace covers; left out when the token may not list
        // Servers in every namespace.
        let servers = match api::list(client, Kind::Server, None).await {
            Ok(servers) => servers,
            Err(ApiFailure::Unauthorized) => return Err(ApiFailure::Unauthorized),
            Err(_) => Vec::new(),
        };
        return Ok(render::workspaces_fragment(&list, &unclaimed_namespaces(&list, &servers), now));
    };
    let (kind, ns) = (*kind, namespace.as_deref());
    let object = api::get(client, kind, ns, name).await?;
    let tree_ns = match kind {
        Kind::Workspace => workspace_namespace(&object),
        _ => ns.unwrap_or_default().to_string(),
    };
    let objs = api::namespace_objects(client, &tree_ns, (kind == Kind::Workspace).then_some(name.as_str())).await?;
    let root = match kind {
        Kind::Workspace => Root::Workspace(name.clone()),
        Kind::Cluster => Root::Cluster(name.clone()),
        Kind::Server => Root::Server(name.clone()),
        Kind::TaskServ => Root::TaskServ(name.clone()),
    };
    // The object can be gone from a list read a moment after the get: an empty tree then.
    let rows = trace::build(&root, &objs).unwrap_or_default();
    let allowed = allowed(session, kind, ns, name).await?;
    let (events, records) = match ns {
        Some(ns) => {
            let uid = object["metadata"]["uid"].as_str().unwrap_or_default();
            let (e, r) = futures::join!(api::events_about(client, ns, kind, name), api::change_records(client, ns, uid));
            (section(e)?, section(r)?)
        }
        None => (Ok(vec![]), Ok(vec![])),
    };
    let runs: Vec<(String, Value)> = match kind {
        Kind::TaskServ => object["status"]["servers"].as_array().into_iter().flatten().map(|e| (name.clone(), e.clone())).collect(),
        Kind::Server => objs
            .taskservs
            .iter()
            .flat_map(|ts| {
                let ts_name = ts["metadata"]["name"].as_str().unwrap_or_default().to_string();
                ts["status"]["servers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|e| e["name"] == name.as_str())
                    .map(move |e| (ts_name.clone(), e.clone()))
            })
            .collect(),
        _ => vec![],
    };
    let ready_history = (kind == Kind::Cluster).then(|| {
        let counts = &object["status"]["servers"];
        let count = |k: &str| u32::try_from(counts[k].as_u64().unwrap_or(0)).unwrap_or(u32::MAX);
        session.record_ready(
            &format!("{tree_ns}/{name}"),
            ReadyPoint { at: now.timestamp(), ready: count("ready"), desired: count("desired") },
        )
    });
    Ok(render::object_fragment(&ObjectView {
        kind,
        namespace: ns,
        object: &object,
        rows: &rows,
        tree_namespace: &tree_ns,
        allowed,
        csrf: &session.csrf,
        events,
        records,
        runs,
        ready_history,
        now,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_to_pages_and_back() {
        for path in [
            "/",
            "/workspaces/demo",
            "/namespaces/demo/clusters/etcd",
            "/namespaces/demo/servers/web-1",
            "/namespaces/demo/taskservs/redis",
        ] {
            let page = Page::parse(path);
            assert_eq!(page.as_ref().map(Page::path).as_deref(), Some(path), "{path}");
        }
        for bad in ["/namespaces/demo/pods/x", "/namespaces/demo/workspaces/x", "/workspaces/Bad_Name", "/namespaces/../servers/x", "/x"] {
            assert_eq!(Page::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn namespaces_with_servers_and_no_workspace_are_found() {
        let workspaces = [
            serde_json::json!({"metadata": {"name": "demo"}, "status": {"namespace": "demo"}}),
            serde_json::json!({"metadata": {"name": "team"}, "spec": {"namespace": "team-ns"}}),
        ];
        let servers: Vec<Value> = ["demo", "team-ns", "legacy", "legacy", "etcd-demo"]
            .iter()
            .map(|ns| serde_json::json!({"metadata": {"name": "s", "namespace": ns}}))
            .collect();
        assert_eq!(unclaimed_namespaces(&workspaces, &servers), vec![("etcd-demo".to_string(), 1), ("legacy".to_string(), 2)]);
        assert!(unclaimed_namespaces(&workspaces, &[]).is_empty());
    }
}
