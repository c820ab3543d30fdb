//! Server-rendered HTML: pure functions from API objects (as JSON) to markup, so every page is
//! tested, and benchmarked, without a server. Every value from the API is escaped; states are
//! written as a symbol and a word, never as colour alone.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::api::Kind;
use super::charts;
use super::html::esc;
use super::session::ReadyPoint;
use crate::trace::{Row, age};

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// The page of an object: `/workspaces/NAME` or `/namespaces/NS/PLURAL/NAME`.
pub fn object_path(kind: Kind, namespace: Option<&str>, name: &str) -> String {
    match (kind, namespace) {
        (Kind::Workspace, _) | (_, None) => format!("/workspaces/{name}"),
        (k, Some(ns)) => format!("/namespaces/{ns}/{}/{name}", k.plural()),
    }
}

/// A state as a symbol and words: `✔ Ready`, `✖ Failed`, `◐ Provisioning`, `◌ Unknown`.
pub fn badge(ready: &str, phase: &str) -> String {
    let (class, symbol) = match (ready, phase) {
        (_, "Failed" | "Error" | "Degraded") => ("bad", "✖"),
        ("True", _) => ("ok", "✔"),
        ("False", _) => ("busy", "◐"),
        _ => ("unknown", "◌"),
    };
    let words = match (phase.is_empty(), ready) {
        (true, "True") => "Ready".to_string(),
        (true, "False") => "Not ready".to_string(),
        (true, _) => "Unknown".to_string(),
        (false, _) => phase.to_string(),
    };
    format!("<span class=\"badge {class}\"><span aria-hidden=\"true\">{symbol}</span> {}</span>", esc(&words))
}

/// A condition's status as a symbol and a word. For the abnormal-true types (Reconciling,
/// Stalled, Drifted, Paused, Degraded) True is the state to look at and False is quiet.
fn condition_status(kind: &str, status: &str) -> String {
    let abnormal_true = matches!(kind, "Reconciling" | "Stalled" | "Drifted" | "Paused" | "Degraded");
    let (class, symbol) = match (abnormal_true, status) {
        (false, "True") => ("ok", "✔"),
        (false, "False") => ("bad", "✖"),
        (true, "True") if kind == "Stalled" || kind == "Degraded" => ("bad", "⚠"),
        (true, "True") => ("busy", "◐"),
        (true, "False") => ("quiet", "–"),
        _ => ("unknown", "◌"),
    };
    format!("<span class=\"badge {class}\"><span aria-hidden=\"true\">{symbol}</span> {}</span>", esc(status))
}

/// What the page chrome needs: title, the signed-in user, the CSRF token, breadcrumbs and the
/// live-update stream of the page.
pub struct Layout<'a> {
    /// Page heading and title.
    pub title: &'a str,
    /// The signed-in user's name.
    pub user: &'a str,
    /// CSRF token for forms.
    pub csrf: &'a str,
    /// Links above the heading: (text, href); an empty href is plain text.
    pub crumbs: Vec<(String, String)>,
    /// The page path; the live stream is `/live` + this.
    pub path: &'a str,
    /// When the content was rendered.
    pub now: DateTime<Utc>,
}

/// A full page around `live` (the part live updates replace).
pub fn page(layout: &Layout<'_>, live: &str) -> String {
    let mut crumbs = String::from("<a href=\"/\">Workspaces</a>");
    for (text, href) in &layout.crumbs {
        let item = if href.is_empty() { esc(text) } else { format!("<a href=\"{}\">{}</a>", esc(href), esc(text)) };
        crumbs.push_str(&format!(" <span aria-hidden=\"true\">›</span> {item}"));
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title} · Provisioning</title>\
<link rel=\"stylesheet\" href=\"/static/console.css\"><script src=\"/static/console.js\" defer></script></head><body>\
<a class=\"skip\" href=\"#main\">Skip to content</a>\
<header><span class=\"brand\">Provisioning</span><nav aria-label=\"Breadcrumb\">{crumbs}</nav>\
<span class=\"user\">Signed in as <strong>{user}</strong></span>\
<form method=\"post\" action=\"/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><button type=\"submit\">Sign out</button></form></header>\
<main id=\"main\"><h1>{title}</h1>\
<p class=\"live-status\" role=\"status\"><span id=\"live-state\">Live updates starting…</span> · rendered <time id=\"updated\">{at}</time></p>\
<div id=\"live\" data-live=\"/live{path}\">{live}</div></main></body></html>",
        title = esc(layout.title),
        user = esc(layout.user),
        csrf = esc(layout.csrf),
        at = layout.now.format("%H:%M:%S"),
        path = esc(layout.path),
    )
}

/// The sign-in page (the only page served without a session); `dev_data_dir` is the data
/// directory of `provisioning dev` when it started the console, named so that its admin can
/// sign in again.
pub fn login_page(error: Option<&str>, dev_data_dir: Option<&std::path::Path>) -> String {
    let error = error.map(|e| format!("<p class=\"error\" role=\"alert\">✖ {}</p>", esc(e))).unwrap_or_default();
    let dev = dev_data_dir
        .map(|d| {
            let d = esc(&d.display().to_string());
            format!(
                "<p class=\"muted\" id=\"dev-sign-in\">Started by <code>provisioning dev</code>: its admin token is in \
<code>{d}/token</code>, or run <code>provisioning login-link --data-dir {d}</code> for a new one-time sign-in link.</p>"
            )
        })
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>Sign in · Provisioning</title>\
<link rel=\"stylesheet\" href=\"/static/console.css\"></head><body class=\"login\"><main id=\"main\">\
<h1>Provisioning console</h1>{error}\
<form method=\"post\" action=\"/login\"><label for=\"token\">Kubernetes bearer token</label>\
<textarea id=\"token\" name=\"token\" rows=\"4\" autocomplete=\"off\" spellcheck=\"false\" required></textarea>\
<p class=\"muted\">Every request the console makes uses this token, so RBAC decides what you see and may do. \
<code>kubectl create token NAME</code> prints one for a ServiceAccount; <code>provisioning dev</code> prints a one-time sign-in link.</p>{dev}\
<button type=\"submit\" id=\"sign-in\">Sign in</button></form></main></body></html>"
    )
}

/// A page with one message (403, 404, 409…).
pub fn message_page(title: &str, message: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t} · Provisioning</title>\
<link rel=\"stylesheet\" href=\"/static/console.css\"></head><body><main id=\"main\"><h1>{t}</h1><p class=\"error\" role=\"alert\">{m}</p>\
<p><a href=\"/\">Back to the workspaces</a></p></main></body></html>",
        t = esc(title),
        m = esc(message)
    )
}

fn ready_of(v: &Value) -> &str {
    v["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("Unknown")
}

/// The roll-up of a Workspace's resources as `kubectl get ws` shows it (`3/4 ready, 1
/// failed`), with the worst one's reason and message while they are not all Ready (the
/// `ResourcesReady` condition, as `clusterctl describe` shows a parent).
fn rollup_cell(ws: &Value) -> String {
    let summary = str_at(ws, "/status/counts/summary");
    let mut out = if summary.is_empty() { "-".to_string() } else { esc(summary) };
    let worst = ws["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "ResourcesReady"));
    if let Some(c) = worst.filter(|c| c["status"] == "False") {
        out.push_str(&format!(
            "<br><span class=\"muted\">{}: {}</span>",
            esc(c["reason"].as_str().unwrap_or_default()),
            esc(c["message"].as_str().unwrap_or_default())
        ));
    }
    out
}

/// The Workspaces list: phase, the roll-up of their resources, cost and counts, each name
/// linking to its tree; then the namespaces whose Servers no Workspace covers.
pub fn workspaces_fragment(workspaces: &[Value], unclaimed: &[(String, usize)], now: DateTime<Utc>) -> String {
    let mut out = if workspaces.is_empty() {
        "<p>No Workspaces yet. <code>kubectl apply -f examples/simulated/</code> creates one.</p>".to_string()
    } else {
        workspaces_table(workspaces, now)
    };
    if !unclaimed.is_empty() {
        out.push_str(
            "<table id=\"no-workspace\"><caption>Namespaces with Servers but no Workspace (the controller's default workspace settings apply)</caption>\
<thead><tr><th scope=\"col\">Namespace</th><th scope=\"col\">Servers</th></tr></thead><tbody>",
        );
        for (ns, servers) in unclaimed {
            out.push_str(&format!("<tr><th scope=\"row\">{}</th><td>{servers}</td></tr>", esc(ns)));
        }
        out.push_str("</tbody></table>");
    }
    out
}

fn workspaces_table(workspaces: &[Value], now: DateTime<Utc>) -> String {
    let mut out = String::from(
        "<table><caption>Workspaces</caption><thead><tr><th scope=\"col\">Name</th><th scope=\"col\">Status</th>\
<th scope=\"col\">Resources</th><th scope=\"col\">Namespace</th><th scope=\"col\">Servers</th><th scope=\"col\">Clusters</th>\
<th scope=\"col\">TaskServs</th><th scope=\"col\">Cost</th><th scope=\"col\">Age</th></tr></thead><tbody>",
    );
    for ws in workspaces {
        let name = str_at(ws, "/metadata/name");
        let count = |k: &str| ws["status"]["counts"][k].as_u64().map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        let cost = str_at(ws, "/status/cost/summary");
        out.push_str(&format!(
            "<tr id=\"ws-{id}\"><th scope=\"row\"><a href=\"{href}\">{n}</a></th><td>{badge}</td><td>{rollup}</td><td>{ns}</td><td>{s}</td><td>{c}</td><td>{t}</td><td>{cost}</td><td>{age}</td></tr>",
            id = esc(name),
            href = esc(&object_path(Kind::Workspace, None, name)),
            n = esc(name),
            badge = badge(ready_of(ws), str_at(ws, "/status/phase")),
            rollup = rollup_cell(ws),
            ns = esc(str_at(ws, "/status/namespace")),
            s = count("servers"),
            c = count("clusters"),
            t = count("taskservs"),
            cost = if cost.is_empty() { "-".into() } else { esc(cost) },
            age = age(str_at(ws, "/metadata/creationTimestamp"), now),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// An owned tree (the rows of [`crate::trace::build`]) as a table with one link per object.
pub fn tree_table(rows: &[Row], namespace: &str, now: DateTime<Utc>) -> String {
    let mut out = String::with_capacity(rows.len() * 400 + 256);
    out.push_str(
        "<table class=\"tree\"><caption>Owned objects</caption><thead><tr><th scope=\"col\">Object</th><th scope=\"col\">Status</th>\
<th scope=\"col\">Age</th><th scope=\"col\">Message</th></tr></thead><tbody>",
    );
    for r in rows {
        let (kind, name) = r.object.split_once('/').unwrap_or((&r.object, ""));
        let kind_enum = match kind {
            "Workspace" => Some(Kind::Workspace),
            "Cluster" => Some(Kind::Cluster),
            "Server" => Some(Kind::Server),
            "TaskServ" => Some(Kind::TaskServ),
            _ => None,
        };
        let label = format!("<span class=\"kind\">{}</span> {}", esc(kind), esc(name));
        let cell = match kind_enum {
            Some(k) => format!("<a href=\"{}\">{label}</a>", esc(&object_path(k, Some(namespace), name))),
            None => label,
        };
        let age = if r.created.is_empty() { String::new() } else { age(&r.created, now) };
        let message = if r.steps.is_empty() {
            esc(&r.message)
        } else {
            format!("{} <span class=\"steps\">{}</span>", esc(&r.message), esc(&r.steps))
        };
        out.push_str(&format!(
            "<tr class=\"d{}\" data-object=\"{}\"><th scope=\"row\">{cell}</th><td>{}</td><td>{age}</td><td>{message}</td></tr>",
            r.depth.min(6),
            esc(&r.object),
            badge(&r.ready, &r.status),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// What the visitor may do to the object (SelfSubjectAccessReview answers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allowed {
    /// May patch it (pause/resume, reconcile now; approving needs it too).
    pub patch: bool,
    /// May `approve` it (the virtual verb the controller checks for the user who set the
    /// approval: controller/src/approval/authorize.rs); the Approve button needs it and `patch`.
    pub approve: bool,
    /// May delete it.
    pub delete: bool,
}

/// Annotation that pauses reconciling.
pub const PAUSED: &str = "provisioning.dev/paused";
/// Annotation that approves a plan by id.
pub const APPROVE: &str = "provisioning.dev/approve";
/// Annotation that asks for a reconcile now.
pub const RECONCILE: &str = "provisioning.dev/reconcile-requested-at";

fn action_form(csrf: &str, kind: Kind, ns: Option<&str>, name: &str, action: &str, extra: &str, label: &str) -> String {
    format!(
        "<form method=\"post\" action=\"/actions\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
<input type=\"hidden\" name=\"kind\" value=\"{}\"><input type=\"hidden\" name=\"namespace\" value=\"{}\">\
<input type=\"hidden\" name=\"name\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"{action}\">{extra}\
<button type=\"submit\" id=\"action-{action}\">{label}</button></form>",
        esc(csrf),
        kind.plural(),
        esc(ns.unwrap_or_default()),
        esc(name),
    )
}

/// The action buttons the visitor may use; nothing at all when they may do nothing.
pub fn actions(obj: &Value, kind: Kind, ns: Option<&str>, allowed: Allowed, csrf: &str) -> String {
    let name = str_at(obj, "/metadata/name");
    let mut out = String::new();
    if allowed.patch {
        let plan_id = str_at(obj, "/status/plan/id");
        let approved = obj["metadata"]["annotations"][APPROVE].as_str();
        let has_changes = obj["status"]["plan"]["changes"].as_array().is_some_and(|cs| cs.iter().any(|c| c["action"] != "NoOp"));
        if allowed.approve && !plan_id.is_empty() && has_changes && approved != Some(plan_id) {
            let extra = format!("<input type=\"hidden\" name=\"plan\" value=\"{}\">", esc(plan_id));
            out.push_str(&action_form(csrf, kind, ns, name, "approve", &extra, &format!("✔ Approve plan {}", esc(plan_id))));
        }
        if obj["metadata"]["annotations"][PAUSED] == "true" {
            out.push_str(&action_form(csrf, kind, ns, name, "resume", "", "▶ Resume"));
        } else {
            out.push_str(&action_form(csrf, kind, ns, name, "pause", "", "❚❚ Pause"));
        }
        out.push_str(&action_form(csrf, kind, ns, name, "reconcile", "", "↻ Reconcile now"));
    }
    if allowed.delete {
        out.push_str(&format!(
            "<a class=\"button danger\" id=\"action-delete\" href=\"{}/delete\">✕ Delete…</a>",
            esc(&object_path(kind, ns, name))
        ));
    }
    if out.is_empty() { String::new() } else { format!("<div class=\"actions\" role=\"group\" aria-label=\"Actions\">{out}</div>") }
}

/// The delete confirmation page's body.
pub fn delete_confirm(kind: Kind, ns: Option<&str>, name: &str, csrf: &str) -> String {
    let extra = format!("<input type=\"hidden\" name=\"confirm\" value=\"{}\">", esc(name));
    format!(
        "<p>Delete {} <strong>{}</strong>{}? What it owns is torn down with it.</p>{}<p><a href=\"{}\">Cancel</a></p>",
        kind.name(),
        esc(name),
        ns.map(|n| format!(" in namespace {}", esc(n))).unwrap_or_default(),
        action_form(csrf, kind, ns, name, "delete", &extra, "✕ Delete"),
        esc(&object_path(kind, ns, name)),
    )
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(m) => m.iter().map(|(k, v)| format!("{k}: {}", compact(v))).collect::<Vec<_>>().join(", "),
        Value::Array(a) => a.iter().map(compact).collect::<Vec<_>>().join("; "),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// One planned change: `Update spec.plan: small → medium (Server/demo/web-2)`, or the change
/// as it is when it has another shape.
fn change_line(c: &Value) -> String {
    let action = str_at(c, "/action");
    if action.is_empty() {
        return compact(c);
    }
    let mut line = action.to_string();
    for (sep, key) in [(" ", "/field"), (": ", "/from"), (" → ", "/to")] {
        let v = str_at(c, key);
        if !v.is_empty() {
            line.push_str(sep);
            line.push_str(v);
        }
    }
    for (open, key) in [(" (", "/resource"), (" — ", "/reason")] {
        let v = str_at(c, key);
        if !v.is_empty() {
            line.push_str(open);
            line.push_str(v);
            if open == " (" {
                line.push(')');
            }
        }
    }
    line
}

/// `status.plan` (id, summary, changes, cost delta) when present, read as optional JSON.
pub fn plan_section(obj: &Value) -> String {
    let plan = &obj["status"]["plan"];
    if !plan.is_object() {
        return String::new();
    }
    let mut out = format!("<section aria-labelledby=\"plan-h\"><h2 id=\"plan-h\">Plan <code>{}</code></h2>", esc(str_at(plan, "/id")));
    let summary = str_at(plan, "/summary");
    if !summary.is_empty() {
        out.push_str(&format!("<p>{}</p>", esc(summary)));
    }
    if let Some(delta) = plan.get("monthlyCostDelta").filter(|d| !d.is_null() && d.as_str() != Some("")) {
        let currency = str_at(plan, "/currency");
        out.push_str(&format!("<p>Monthly cost change: {} {}</p>", esc(&compact(delta)), esc(currency)));
    }
    let changes = plan["changes"].as_array().cloned().unwrap_or_default();
    if !changes.is_empty() {
        out.push_str("<ul class=\"changes\">");
        for c in changes {
            out.push_str(&format!("<li>{}</li>", esc(&change_line(&c))));
        }
        out.push_str("</ul>");
    }
    if obj["metadata"]["annotations"][APPROVE].as_str().is_some_and(|a| a == str_at(plan, "/id")) {
        out.push_str("<p class=\"badge ok\"><span aria-hidden=\"true\">✔</span> Approved; waiting for the controller to apply it.</p>");
    }
    out.push_str("</section>");
    out
}

/// Conditions as a table.
pub fn conditions_section(obj: &Value, now: DateTime<Utc>) -> String {
    let conds = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut out = String::from("<section aria-labelledby=\"cond-h\"><h2 id=\"cond-h\">Conditions</h2>");
    if conds.is_empty() {
        out.push_str("<p class=\"muted\">None reported yet.</p></section>");
        return out;
    }
    out.push_str(
        "<table><thead><tr><th scope=\"col\">Type</th><th scope=\"col\">Status</th><th scope=\"col\">Reason</th>\
<th scope=\"col\">Message</th><th scope=\"col\">Changed</th></tr></thead><tbody>",
    );
    for c in conds {
        out.push_str(&format!(
            "<tr><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td><td>{} ago</td></tr>",
            esc(str_at(&c, "/type")),
            condition_status(str_at(&c, "/type"), str_at(&c, "/status")),
            esc(str_at(&c, "/reason")),
            esc(str_at(&c, "/message")),
            age(str_at(&c, "/lastTransitionTime"), now),
        ));
    }
    out.push_str("</tbody></table></section>");
    out
}

/// A section whose data could not be read (RBAC): says so instead of the content.
pub type Section = Result<Vec<Value>, String>;

/// One ChangeRecord as a diff: when, which generation, who (the last spec writer), how it
/// ended, then each change as `field: from → to` from the plan it carried out, or the changed
/// field names where it had no plan (values are never recorded elsewhere: they may be secret).
fn record_item(r: &Value) -> String {
    let spec = &r["spec"];
    let mut head = format!("generation {}", spec["generation"].as_i64().map(|g| g.to_string()).unwrap_or_else(|| "?".into()));
    if let Some(manager) = spec["changedBy"].as_array().and_then(|w| w.first()).map(|w| str_at(w, "/manager")).filter(|m| !m.is_empty()) {
        head.push_str(&format!(" by {manager}"));
    }
    let summary = str_at(spec, "/summary");
    if !summary.is_empty() {
        head.push_str(&format!(": {summary}"));
    }
    let phase = str_at(r, "/status/phase");
    let mut out = format!("<li><time>{}</time> {}", esc(str_at(r, "/metadata/creationTimestamp")), esc(&head));
    if !phase.is_empty() {
        let class = match phase {
            "Succeeded" => "badge ok",
            "Failed" | "Stalled" => "badge bad",
            _ => "badge",
        };
        out.push_str(&format!(" <span class=\"{class}\">{}</span>", esc(phase)));
    }
    let changes: Vec<&Value> =
        spec["plan"]["changes"].as_array().map(|cs| cs.iter().filter(|c| c["action"] != "NoOp").collect()).unwrap_or_default();
    let lines: Vec<String> = if changes.is_empty() {
        spec["changedFields"]
            .as_array()
            .map(|fs| fs.iter().filter_map(Value::as_str).map(|f| format!("{f} changed")).collect())
            .unwrap_or_default()
    } else {
        changes.into_iter().map(change_line).collect()
    };
    if !lines.is_empty() {
        out.push_str("<ul class=\"changes\">");
        for l in lines {
            out.push_str(&format!("<li>{}</li>", esc(&l)));
        }
        out.push_str("</ul>");
    }
    out.push_str("</li>");
    out
}

/// Events and ChangeRecords, newest first.
pub fn history_section(events: &Section, records: &Section, now: DateTime<Utc>) -> String {
    let mut out = String::from("<section aria-labelledby=\"hist-h\"><h2 id=\"hist-h\">History</h2>");
    match records {
        Ok(list) if !list.is_empty() => {
            out.push_str("<h3>Applied changes</h3><ul class=\"records\">");
            for r in list.iter().rev() {
                out.push_str(&record_item(r));
            }
            out.push_str("</ul>");
        }
        Ok(_) => {}
        Err(e) => out.push_str(&format!("<p class=\"muted\">Change records not shown: {}</p>", esc(e))),
    }
    match events {
        Ok(list) if list.is_empty() => out.push_str("<p class=\"muted\">No events.</p>"),
        Ok(list) => {
            out.push_str(
                "<table><caption>Events</caption><thead><tr><th scope=\"col\">When</th><th scope=\"col\">Type</th>\
<th scope=\"col\">Reason</th><th scope=\"col\">Note</th></tr></thead><tbody>",
            );
            for e in list.iter().rev().take(100) {
                let warning = e["type"] == "Warning";
                out.push_str(&format!(
                    "<tr><td>{} ago</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    age(super::api::event_time(e), now),
                    if warning {
                        "<span class=\"badge bad\"><span aria-hidden=\"true\">⚠</span> Warning</span>"
                    } else {
                        "<span class=\"badge\"><span aria-hidden=\"true\">ℹ</span> Normal</span>"
                    },
                    esc(str_at(e, "/reason")),
                    esc(str_at(e, "/note")),
                ));
            }
            out.push_str("</tbody></table>");
        }
        Err(e) => out.push_str(&format!("<p class=\"muted\">Events not shown: {}</p>", esc(e))),
    }
    out.push_str("</section>");
    out
}

/// The last script run per (TaskServ, server): `(taskserv, entry of status.servers)`.
pub fn script_output_section(runs: &[(String, Value)]) -> String {
    let runs: Vec<&(String, Value)> = runs.iter().filter(|(_, e)| e["lastRun"].is_object()).collect();
    let mut out = String::from("<section aria-labelledby=\"out-h\"><h2 id=\"out-h\">Last script output</h2>");
    if runs.is_empty() {
        out.push_str("<p class=\"muted\">No script has run yet.</p></section>");
        return out;
    }
    for (ts, e) in runs {
        let run = &e["lastRun"];
        let exit = run["exitCode"]
            .as_i64()
            .map(|c| if c == 0 { "✔ exit 0".to_string() } else { format!("✖ exit {c}") })
            .unwrap_or_else(|| "▶ running".into());
        out.push_str(&format!(
            "<h3>{} on {}: {} ({})</h3><p class=\"muted\">started {} · finished {}</p><pre class=\"output\">{}</pre>",
            esc(ts),
            esc(str_at(e, "/name")),
            esc(str_at(run, "/script")),
            esc(&exit),
            esc(str_at(run, "/startedAt")),
            esc(str_at(run, "/finishedAt")),
            esc(str_at(run, "/outputTail")),
        ));
    }
    out.push_str("</section>");
    out
}

/// Everything an object page shows; the Cluster page adds its charts.
pub struct ObjectView<'a> {
    /// Kind of the object.
    pub kind: Kind,
    /// Its namespace (None for a Workspace).
    pub namespace: Option<&'a str>,
    /// The object.
    pub object: &'a Value,
    /// Its owned tree (first row: the object itself).
    pub rows: &'a [Row],
    /// Namespace the tree's links point into.
    pub tree_namespace: &'a str,
    /// What the visitor may do.
    pub allowed: Allowed,
    /// The session's CSRF token.
    pub csrf: &'a str,
    /// Events about the object.
    pub events: Section,
    /// ChangeRecords of the object.
    pub records: Section,
    /// Last script runs to show.
    pub runs: Vec<(String, Value)>,
    /// Ready-over-time points (Clusters).
    pub ready_history: Option<Vec<ReadyPoint>>,
    /// Render time.
    pub now: DateTime<Utc>,
}

/// The live part of an object page.
pub fn object_fragment(v: &ObjectView<'_>) -> String {
    let obj = v.object;
    let mut out = String::with_capacity(v.rows.len() * 500 + 4096);
    let first = v.rows.first();
    out.push_str(&format!(
        "<p class=\"summary\">{} {}</p>",
        badge(first.map_or("Unknown", |r| r.ready.as_str()), str_at(obj, "/status/phase")),
        esc(first.map_or("", |r| r.message.as_str()))
    ));
    if obj["metadata"]["annotations"][PAUSED] == "true" {
        out.push_str("<p class=\"badge busy\"><span aria-hidden=\"true\">❚❚</span> Paused: the controller leaves this object alone until it is resumed.</p>");
    }
    if obj["metadata"]["deletionTimestamp"].is_string() {
        out.push_str("<p class=\"badge busy\"><span aria-hidden=\"true\">✕</span> Being deleted.</p>");
    }
    out.push_str(&actions(obj, v.kind, v.namespace, v.allowed, v.csrf));
    out.push_str(&plan_section(obj));
    if v.kind == Kind::Cluster {
        let counts = &obj["status"]["servers"];
        out.push_str(&format!(
            "<section aria-labelledby=\"ready-h\"><h2 id=\"ready-h\">Servers ready over time</h2><p>{} of {} ready. \
The chart is kept in the console's memory for your session, from the watch events since you opened this Cluster.</p>{}</section>",
            counts["ready"].as_u64().unwrap_or(0),
            counts["desired"].as_u64().unwrap_or(0),
            v.ready_history.as_deref().map(|h| charts::ready_chart(h, v.now)).unwrap_or_default()
        ));
        let steps = obj["status"]["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
        out.push_str(&format!(
            "<section aria-labelledby=\"steps-h\"><h2 id=\"steps-h\">Steps</h2>{}</section>",
            charts::steps_timeline(steps, v.now)
        ));
    }
    out.push_str(&format!(
        "<section aria-labelledby=\"tree-h\"><h2 id=\"tree-h\">Tree</h2>{}</section>",
        tree_table(v.rows, v.tree_namespace, v.now)
    ));
    out.push_str(&conditions_section(obj, v.now));
    if matches!(v.kind, Kind::Server | Kind::TaskServ) {
        out.push_str(&script_output_section(&v.runs));
    }
    out.push_str(&history_section(&v.events, &v.records, v.now));
    let spec = serde_json::to_string_pretty(&obj["spec"]).unwrap_or_default();
    out.push_str(&format!("<details><summary>Spec</summary><pre>{}</pre></details>", esc(&spec)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-24T00:10:00Z").map(|t| t.with_timezone(&Utc)).unwrap_or_default()
    }

    #[test]
    fn values_from_the_api_are_escaped() {
        let ws = json!({"metadata": {"name": "<script>x</script>", "creationTimestamp": "2026-11-24T00:00:00Z"},
            "status": {"phase": "Ready\"><b>", "conditions": [{"type": "Ready", "status": "True"}]}});
        let html = workspaces_fragment(&[ws], &[("<i>ns</i>".into(), 1)], now());
        assert!(!html.contains("<script>") && !html.contains("\"><b>") && !html.contains("<i>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }

    #[test]
    fn the_home_page_rolls_up_each_workspace_and_names_uncovered_namespaces() {
        let ws = json!({"metadata": {"name": "demo", "creationTimestamp": "2026-11-24T00:00:00Z"},
            "status": {"phase": "Degraded", "namespace": "demo",
                "counts": {"servers": 4, "clusters": 0, "taskservs": 0, "ready": 3, "progressing": 0, "failed": 1, "summary": "3/4 ready, 1 failed"},
                "conditions": [{"type": "Ready", "status": "False", "reason": "ResourcesFailed"},
                    {"type": "ResourcesReady", "status": "False", "reason": "UnknownProvider", "message": "Server broken: provider \"nowhere\" is not defined"}]}});
        let html = workspaces_fragment(&[ws], &[("legacy".into(), 2)], now());
        assert!(html.contains("<th scope=\"col\">Resources</th>"), "{html}");
        assert!(html.contains("<td>3/4 ready, 1 failed<br><span class=\"muted\">UnknownProvider: Server broken: provider &quot;nowhere&quot; is not defined</span></td>"), "{html}");
        assert!(
            html.contains("Namespaces with Servers but no Workspace") && html.contains("<th scope=\"row\">legacy</th><td>2</td>"),
            "{html}"
        );
        // All Ready: the counts only; nothing uncovered: no second table.
        let ok = json!({"metadata": {"name": "demo"}, "status": {"counts": {"summary": "3/3 ready"},
            "conditions": [{"type": "ResourcesReady", "status": "True", "reason": "AllReady", "message": "3/3 ready"}]}});
        let html = workspaces_fragment(&[ok], &[], now());
        assert!(html.contains("<td>3/3 ready</td>") && !html.contains("AllReady") && !html.contains("no-workspace"), "{html}");
    }

    #[test]
    fn actions_follow_what_the_visitor_may_do() {
        let obj = json!({"metadata": {"name": "web", "annotations": {PAUSED: "true"}},
            "status": {"plan": {"id": "p1", "summary": "1 to create", "changes": [{"action": "Create", "resource": "Server/demo/web"}]}}});
        assert_eq!(actions(&obj, Kind::Server, Some("demo"), Allowed::default(), "c"), "");
        let all = actions(&obj, Kind::Server, Some("demo"), Allowed { patch: true, approve: true, delete: true }, "c");
        for id in ["action-approve", "action-resume", "action-reconcile", "action-delete"] {
            assert!(all.contains(id), "{id}: {all}");
        }
        assert!(!all.contains("action-pause"), "{all}");
        let approved = json!({"metadata": {"name": "web", "annotations": {APPROVE: "p1"}}, "status": {"plan": {"id": "p1"}}});
        let html = actions(&approved, Kind::Server, Some("demo"), Allowed { patch: true, approve: true, delete: false }, "c");
        assert!(!html.contains("action-approve") && html.contains("action-pause") && !html.contains("action-delete"), "{html}");
        assert!(plan_section(&approved).contains("Approved"));
        let change = json!({"resource": "Server/demo/web", "field": "spec.plan", "action": "Update", "from": "small", "to": "medium"});
        assert_eq!(change_line(&change), "Update spec.plan: small → medium (Server/demo/web)");
    }

    #[test]
    fn approve_is_offered_only_to_a_visitor_who_may_approve() {
        // Issue 26: `patch` alone (what `edit` holds) no longer makes an approval count, so the
        // button follows the `approve` verb; approving without `patch` cannot set the annotation.
        let obj = json!({"metadata": {"name": "web"},
            "status": {"plan": {"id": "p1", "changes": [{"action": "Create", "resource": "Server/demo/web"}]}}});
        let edit = actions(&obj, Kind::Server, Some("demo"), Allowed { patch: true, approve: false, delete: true }, "c");
        assert!(!edit.contains("action-approve") && edit.contains("action-pause"), "{edit}");
        let approve_only = actions(&obj, Kind::Server, Some("demo"), Allowed { patch: false, approve: true, delete: false }, "c");
        assert!(!approve_only.contains("action-approve"), "{approve_only}");
        let admin = actions(&obj, Kind::Server, Some("demo"), Allowed { patch: true, approve: true, delete: true }, "c");
        assert!(admin.contains("action-approve"), "{admin}");
    }

    #[test]
    fn approve_is_offered_only_for_a_plan_that_changes_something() {
        let allowed = Allowed { patch: true, approve: true, delete: false };
        for changes in [json!([]), json!([{"action": "NoOp", "resource": "Server/demo/web"}]), Value::Null] {
            let obj = json!({"metadata": {"name": "web"}, "status": {"plan": {"id": "p1", "summary": "no changes", "changes": changes}}});
            let html = actions(&obj, Kind::Server, Some("demo"), allowed, "c");
            assert!(!html.contains("action-approve") && html.contains("action-pause"), "{changes}: {html}");
        }
    }

    #[test]
    fn a_change_record_reads_as_a_diff_by_its_writer() {
        let record = json!({"metadata": {"creationTimestamp": "2026-11-24T00:00:00Z"},
            "spec": {"generation": 3, "changedBy": [{"manager": "kubectl-edit"}, {"manager": "kubectl-client-side-apply"}],
                "summary": "spec.plan changed", "changedFields": ["spec.plan"],
                "plan": {"changes": [{"resource": "Server/demo/web", "field": "spec.plan", "action": "Update", "from": "small", "to": "<b>"},
                    {"resource": "Server/demo/web", "field": "spec.zone", "action": "NoOp"}]}},
            "status": {"phase": "Succeeded"}});
        let html = record_item(&record);
        assert!(html.contains("generation 3 by kubectl-edit: spec.plan changed"), "{html}");
        assert!(html.contains("Update spec.plan: small → &lt;b&gt; (Server/demo/web)") && !html.contains("spec.zone"), "{html}");
        assert!(html.contains("badge ok\">Succeeded"), "{html}");
        let without_plan = json!({"spec": {"generation": 4, "changedFields": ["spec.config.port"]}});
        assert!(record_item(&without_plan).contains("<li>spec.config.port changed</li>"), "{}", record_item(&without_plan));
    }

    #[test]
    fn the_sign_in_page_names_the_way_back_in_for_dev_only() {
        let dev = login_page(None, Some(std::path::Path::new("/tmp/d<x>")));
        assert!(
            dev.contains("<code>/tmp/d&lt;x&gt;/token</code>") && dev.contains("provisioning login-link --data-dir /tmp/d&lt;x&gt;"),
            "{dev}"
        );
        assert!(!login_page(None, None).contains("login-link"));
    }

    #[test]
    fn badges_carry_a_symbol_and_a_word() {
        assert!(badge("True", "Running").contains("✔") && badge("True", "Running").contains("Running"));
        assert!(badge("False", "Failed").contains("✖"));
        assert!(badge("False", "Provisioning").contains("◐"));
        assert!(badge("Unknown", "").contains("Unknown"));
    }
}
