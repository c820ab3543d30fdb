//! HTTPS listener, authentication and request routing.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::error::{ApiError, ApiResult};
use crate::handlers::{Core, DeleteOptions, FieldValidation, Output, Propagation, WriteOptions, parse_body};
use crate::patch::PatchType;
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::{openapi, table, watch};

/// Request bodies above this are refused with 413.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

fn json_response(code: u16, body: Bytes) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn value_response(code: u16, v: &Value) -> Response<Body> {
    json_response(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

fn error_response(e: &ApiError) -> Response<Body> {
    value_response(e.code, &e.to_status())
}

/// Serves HTTPS on `listener` until `core.shutdown` is cancelled.
pub async fn serve(core: Arc<Core>, listener: TcpListener, tls: Arc<rustls::ServerConfig>, token: Arc<crate::auth::Auth>) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = core.shutdown.cancelled() => break,
        };
        let Ok((tcp, _peer)) = accepted else { continue };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let core = core.clone();
        let token = token.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await else { return };
            let svc = hyper::service::service_fn(move |req| {
                let core = core.clone();
                let token = token.clone();
                async move { Ok::<_, Infallible>(handle(core, &token, req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tls), svc);
            let _ = watcher.watch(conn.into_owned()).await;
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}

/// Decodes `%XX` escapes and `+` of a path segment or query component.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parsed query parameters.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Query(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(p), String::new()),
                })
                .collect(),
        )
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true") | Some("1") | Some(""))
    }
}

async fn handle(core: Arc<Core>, auth: &crate::auth::Auth, req: Request<Incoming>) -> Response<Body> {
    use crate::auth::{Attributes, reviews};
    let path = req.uri().path().to_string();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        let mut r = Response::new(full("ok"));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return r;
    }
    let attrs = Attributes::from_request(req.method(), &path, req.uri().query());
    let user = match auth.authenticate(&core, req.headers()) {
        Ok(u) => u,
        Err(e) => {
            // The reason names what was wrong with the credential, never the credential.
            tracing::warn!(reason = %e, verb = %attrs.verb, path = %path, "unauthorized");
            return error_response(&ApiError::unauthorized());
        }
    };
    let user = match auth.impersonate(&core, user, req.headers()) {
        Ok(u) => u,
        Err(e) => return error_response(&e),
    };
    let decision = auth.authorize(&core, &user, &attrs);
    if !decision.allowed {
        crate::auth::warn_forbidden(&user, &attrs);
        return error_response(&attrs.forbidden(&user, &decision.reason));
    }
    if let Some(review) = reviews::Review::of(&attrs) {
        if req.method() != Method::POST {
            return error_response(&ApiError::method_not_allowed(format!("method {} is not supported on this path", req.method())));
        }
        let ct = content_type(&req);
        let result = async {
            let body = read_body(req).await?;
            let obj = if ct.contains("protobuf") { crate::auth::proto::decode(&body)? } else { parse_body(&body, &ct)? };
            reviews::create(auth, &core, &user, &attrs, review, obj)
        }
        .await;
        return match result {
            Ok(v) => value_response(201, &v),
            Err(e) => error_response(&e),
        };
    }
    match route(core, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn read_body(req: Request<Incoming>) -> ApiResult<Bytes> {
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok())
        && len > MAX_BODY {
            return Err(ApiError::too_large());
        }
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                Err(ApiError::too_large())
            } else {
                Err(ApiError::bad_request(format!("reading request body: {e}")))
            }
        }
    }
}

struct Target {
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    watch: bool,
}

async fn route(core: Arc<Core>, req: Request<Incoming>) -> ApiResult<Response<Body>> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(percent_decode).collect();
    let get = req.method() == Method::GET;
    let reg = core.registry();
    match segs.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["version"] if get => {
            return Ok(value_response(200, &json!({
                "major": "1", "minor": "37", "emulationMajor": "1", "emulationMinor": "37",
                "gitVersion": "v1.37.0+provisioning", "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "rustc", "platform": "linux/amd64",
            })));
        }
        ["api" | "apis"] if get && crate::discovery::wants_aggregated(&accept_header(&req)) => {
            let doc = if segs[0] == "api" { crate::discovery::core(&reg) } else { crate::discovery::apis(&reg) };
            let mut r = value_response(200, &doc);
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::discovery::AGGREGATED_CONTENT_TYPE));
            r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
            return Ok(r);
        }
        ["api"] if get => {
            return Ok(value_response(200, &json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})));
        }
        ["apis"] if get => return Ok(value_response(200, &reg.api_group_list())),
        ["api", "v1"] if get => {
            return reg.api_resource_list("", "v1").map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found);
        }
        ["apis", g] if get => return reg.api_group(g).map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found),
        ["apis", g, v] if get => {
            return reg.api_resource_list(g, v).map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found);
        }
        ["openapi", "v3"] if get => return Ok(value_response(200, &openapi::index(&reg))),
        ["openapi", "v3", rest @ ..] if get => {
            let gv = rest.join("/");
            return openapi::document(&reg, &gv).map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found);
        }
        _ => {}
    }
    let (group, version, rest): (&str, &str, &[String]) = match segs.first().map(String::as_str) {
        Some("api") if segs.len() >= 3 => ("", segs[1].as_str(), &segs[2..]),
        Some("apis") if segs.len() >= 4 => (segs[1].as_str(), segs[2].as_str(), &segs[3..]),
        _ => return Err(ApiError::path_not_found()),
    };
    let (watch_prefix, rest) = if rest.first().map(String::as_str) == Some("watch") { (true, &rest[1..]) } else { (false, rest) };
    let target = if rest.len() >= 3 && rest[0] == "namespaces" && reg.get(group, version, &rest[2]).is_some_and(|r| r.namespaced) {
        let rt = reg.get(group, version, &rest[2]).ok_or_else(ApiError::path_not_found)?;
        if rest.len() > 5 {
            return Err(ApiError::path_not_found());
        }
        Target { rt, namespace: Some(rest[1].clone()), name: rest.get(3).cloned(), subresource: rest.get(4).cloned(), watch: watch_prefix }
    } else {
        let Some(first) = rest.first() else { return Err(ApiError::path_not_found()) };
        let rt = reg.get(group, version, first).ok_or_else(ApiError::path_not_found)?;
        if rest.len() > 3 {
            return Err(ApiError::path_not_found());
        }
        Target { rt, namespace: None, name: rest.get(1).cloned(), subresource: rest.get(2).cloned(), watch: watch_prefix }
    };
    if let Some(sub) = &target.subresource
        && !(sub == "status" && target.rt.has_status) && !(sub == "finalize" && target.rt.storage == crate::handlers::NAMESPACES) {
            return Err(ApiError::path_not_found());
        }
    if target.rt.namespaced && target.namespace.is_none() && target.name.is_some() {
        return Err(ApiError::path_not_found());
    }
    resource(core, req, target).await
}

fn accept_header(req: &Request<Incoming>) -> String {
    req.headers().get(header::ACCEPT).and_then(|h| h.to_str().ok()).unwrap_or_default().to_string()
}

fn accept_info(req: &Request<Incoming>) -> (Option<String>, bool) {
    let accept = req.headers().get(header::ACCEPT).and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
    let table = accept.split(',').next().is_some_and(|first| first.contains("as=Table")) || accept.contains("as=Table");
    let partial = accept.contains("as=PartialObjectMetadata");
    (if table { Some("Metadata".to_string()) } else { None }, partial && !table)
}

fn write_options(req: &Request<Incoming>, q: &Query) -> ApiResult<WriteOptions> {
    let ua_manager = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|h| h.to_str().ok())
        .map(|ua| ua.split('/').next().unwrap_or(ua).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let explicit = q.get("fieldManager").filter(|s| !s.is_empty());
    let field_validation = match q.get("fieldValidation") {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => return Err(ApiError::bad_request(format!("fieldValidation parameter unsupported: {other}"))),
    };
    let dry_run = match q.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => return Err(ApiError::bad_request(format!("Invalid dry run value: {other}"))),
    };
    Ok(WriteOptions {
        dry_run,
        field_manager: explicit.map(str::to_string).unwrap_or(ua_manager),
        explicit_manager: explicit.is_some(),
        field_validation,
        force: q.flag("force") && q.get("force") != Some(""),
    })
}

fn with_warnings(mut r: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(h) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, h);
        }
    }
    r
}

fn single(core: &Core, rt: &ResourceType, out: &Output, code: u16, table: &Option<String>) -> Response<Body> {
    match (table, out) {
        (Some(inc), _) => {
            let v = core.convert(rt, out.value());
            if v["kind"] == "Status" {
                return value_response(code, &v);
            }
            let rv = v["metadata"]["resourceVersion"].as_str().map(str::to_string);
            value_response(code, &table::table(rt, &[v], rv, None, inc, true))
        }
        (None, Output::Stored(e)) => json_response(code, core.render(rt, e)),
        (None, Output::Transient(v)) => value_response(code, &core.convert(rt, v.clone())),
    }
}

async fn resource(core: Arc<Core>, req: Request<Incoming>, t: Target) -> ApiResult<Response<Body>> {
    let q = Query::parse(req.uri().query());
    let (mut table, partial) = accept_info(&req);
    if let (Some(tb), Some(inc)) = (table.as_mut(), q.get("includeObject")) {
        *tb = inc.to_string();
    }
    let rt = t.rt.clone();
    let ns = t.namespace.as_deref();
    let status = t.subresource.as_deref() == Some("status");
    let method = req.method().clone();
    match (method, &t.name) {
        (Method::GET, Some(name)) if !t.watch => {
            let e = core.get(&rt, ns, name)?;
            Ok(single(&core, &rt, &Output::Stored(e), 200, &table))
        }
        (Method::GET, name) => {
            let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())?;
            let mut field_str = q.get("fieldSelector").unwrap_or_default().to_string();
            if let Some(n) = name {
                field_str = if field_str.is_empty() { format!("metadata.name={n}") } else { format!("{field_str},metadata.name={n}") };
            }
            let fields = FieldSelector::parse(&field_str)?;
            let watching = t.watch || q.flag("watch");
            watch::validate_list_options(watching, |k| q.get(k))?;
            if watching {
                let mut resource_version = q.get("resourceVersion").map(str::to_string);
                // sendInitialEvents=false without a resourceVersion starts at "most recent":
                // no synthetic ADDED events (reflector.go watchList case 1 with the flag off).
                if q.get("sendInitialEvents").is_some() && !q.flag("sendInitialEvents") && resource_version.as_deref().unwrap_or_default().is_empty() {
                    resource_version = Some(core.store.read().rv.to_string());
                }
                let params = watch::WatchParams {
                    resource_version,
                    namespace: t.namespace.clone(),
                    labels,
                    fields,
                    bookmarks: q.flag("allowWatchBookmarks"),
                    timeout: q.get("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()).filter(|s| *s > 0).map(Duration::from_secs),
                    send_initial_events: q.flag("sendInitialEvents"),
                    partial: partial && table.is_none(),
                    table,
                };
                let rx = watch::start(core.clone(), rt.clone(), params);
                let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx)) });
                let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
                r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
                return Ok(r);
            }
            let limit = q.get("limit").and_then(|s| s.parse::<usize>().ok()).filter(|l| *l > 0);
            let (entries, rv, cont, remaining) = core.list(&rt, ns, &labels, &fields, limit, q.get("continue"))?;
            if let Some(inc) = &table {
                let objs: Vec<Value> = entries.iter().map(|e| core.convert(&rt, e.value())).collect();
                return Ok(value_response(200, &table::table(&rt, &objs, Some(rv.to_string()), cont, inc, true)));
            }
            if partial {
                let items: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let mut md = e.value()["metadata"].take();
                        if let Some(m) = md.as_object_mut() {
                            m.remove("managedFields");
                        }
                        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": md})
                    })
                    .collect();
                let mut meta = json!({"resourceVersion": rv.to_string()});
                if let Some(c) = cont {
                    meta["continue"] = json!(c);
                }
                return Ok(value_response(200, &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items})));
            }
            Ok(json_response(200, core.list_body(&rt, &entries, rv, cont.as_deref(), remaining)))
        }
        (Method::POST, None) => {
            let opts = write_options(&req, &q)?;
            let ct = content_type(&req);
            let body = read_body(req).await?;
            let obj = parse_body(&body, &ct)?;
            let w = core.create(&rt, ns, obj, &opts).await?;
            Ok(with_warnings(single(&core, &rt, &w.output, 201, &table), &w.warnings))
        }
        (Method::PUT, Some(name)) => {
            let opts = write_options(&req, &q)?;
            let ct = content_type(&req);
            let body = read_body(req).await?;
            let obj = parse_body(&body, &ct)?;
            let w = core.update(&rt, ns, name, obj, status, &opts).await?;
            Ok(with_warnings(single(&core, &rt, &w.output, 200, &table), &w.warnings))
        }
        (Method::PATCH, Some(name)) => {
            let opts = write_options(&req, &q)?;
            let ct = content_type(&req);
            let kind = PatchType::from_content_type(&ct)?;
            let body = read_body(req).await?;
            let existed = core.get(&rt, ns, name).is_ok();
            let w = core.patch(&rt, ns, name, kind, &body, &ct, status, &opts).await?;
            let code = if existed || kind != PatchType::Apply { 200 } else { 201 };
            Ok(with_warnings(single(&core, &rt, &w.output, code, &table), &w.warnings))
        }
        (Method::DELETE, name) => {
            let ct = content_type(&req);
            let dry_q = q.get("dryRun") == Some("All");
            let prop_q = q.get("propagationPolicy").map(str::to_string);
            let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())?;
            let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default())?;
            let body = read_body(req).await?;
            let dopts: Value = if body.iter().all(u8::is_ascii_whitespace) { json!({}) } else { parse_body(&body, &ct)? };
            let policy = dopts["propagationPolicy"].as_str().map(str::to_string).or(prop_q);
            let propagation = match policy.as_deref() {
                None | Some("") | Some("Background") => {
                    if dopts["orphanDependents"].as_bool() == Some(true) { Propagation::Orphan } else { Propagation::Background }
                }
                Some("Foreground") => Propagation::Foreground,
                Some("Orphan") => Propagation::Orphan,
                Some(other) => return Err(ApiError::bad_request(format!("unsupported propagationPolicy: {other}"))),
            };
            let dry_run = dry_q || dopts["dryRun"].as_array().is_some_and(|a| a.iter().any(|x| x == "All"));
            let opts = DeleteOptions {
                propagation,
                dry_run,
                uid: dopts["preconditions"]["uid"].as_str().map(str::to_string),
                resource_version: dopts["preconditions"]["resourceVersion"].as_str().map(str::to_string),
            };
            match name {
                Some(name) => {
                    let out = core.delete(&rt, ns, name, &opts).await?;
                    Ok(single(&core, &rt, &out, 200, &None))
                }
                None => {
                    let (entries, rv, _, _) = core.list(&rt, ns, &labels, &fields, None, None)?;
                    let mut deleted = vec![];
                    for e in entries {
                        let ens = if rt.namespaced { Some(e.key.namespace.as_str()) } else { None };
                        match core.delete(&rt, ens, &e.key.name, &opts).await {
                            Ok(_) => deleted.push(e),
                            Err(err) if err.code == 404 => {}
                            Err(err) => return Err(err),
                        }
                    }
                    Ok(json_response(200, core.list_body(&rt, &deleted, rv, None, None)))
                }
            }
        }
        (m, _) => Err(ApiError::method_not_allowed(format!("method {m} is not supported on this path"))),
    }
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers().get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("application/json").to_string()
}
