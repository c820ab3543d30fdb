//! An HTTP proxy on 127.0.0.1 in front of moto that answers scripted EC2 actions itself (an
//! error moto never gives: quotas, capacity, DependencyViolation), optionally only for
//! requests carrying a given form parameter (`Placement.AvailabilityZone=eu-north-1a`), and
//! counts every action it sees; everything else goes to moto unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// One scripted answer: for `action` (and, when set, only requests whose form has
/// `when.0 = when.1`), `times` more times.
struct Answer {
    action: String,
    when: Option<(String, String)>,
    times: u32,
    status: u16,
    body: String,
}

#[derive(Default)]
struct Script {
    answers: Vec<Answer>,
    seen: HashMap<String, u32>,
}

/// The proxy; stops when dropped.
pub struct Ec2Proxy {
    /// `http://127.0.0.1:<port>/`.
    pub endpoint: String,
    script: Arc<Mutex<Script>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Ec2Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An EC2 error document.
pub fn error_doc(code: &str, message: &str) -> String {
    format!(
        "<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>proxy</RequestID></Response>"
    )
}

impl Ec2Proxy {
    /// Starts the proxy in front of `upstream` (moto's endpoint).
    pub async fn start(upstream: &str) -> Result<Ec2Proxy, Box<dyn std::error::Error>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}/", listener.local_addr()?);
        let script = Arc::new(Mutex::new(Script::default()));
        let upstream = upstream.trim_end_matches('/').to_string();
        let shared = script.clone();
        let task = tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (script, upstream, client) = (shared.clone(), upstream.clone(), client.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (script, upstream, client) = (script.clone(), upstream.clone(), client.clone());
                        async move { handle(req, &script, &upstream, &client).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok(Ec2Proxy { endpoint, script, task })
    }

    /// Answers `action` itself `times` more times with `status` and `body`.
    pub fn answer(&self, action: &str, times: u32, status: u16, body: String) {
        self.answer_when(action, None, times, status, body);
    }

    /// Like [`Ec2Proxy::answer`], only for requests whose form has `param = value`.
    pub fn answer_when(&self, action: &str, when: Option<(&str, &str)>, times: u32, status: u16, body: String) {
        if let Ok(mut s) = self.script.lock() {
            s.answers.retain(|a| !(a.action == action && a.when.as_ref().map(|(k, v)| (k.as_str(), v.as_str())) == when));
            s.answers.push(Answer {
                action: action.to_string(),
                when: when.map(|(k, v)| (k.to_string(), v.to_string())),
                times,
                status,
                body,
            });
        }
    }

    /// How many requests of `action` arrived (answered here or by moto).
    pub fn seen(&self, action: &str) -> u32 {
        self.script.lock().map(|s| s.seen.get(action).copied().unwrap_or(0)).unwrap_or(0)
    }
}

async fn handle(
    req: Request<Incoming>,
    script: &Mutex<Script>,
    upstream: &str,
    client: &reqwest::Client,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    let form: Vec<(String, String)> = form_urlencoded::parse(&body).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let action = form.iter().find(|(k, _)| k == "Action").map(|(_, v)| v.clone()).unwrap_or_default();
    let scripted = {
        let mut s = script.lock().map_err(|_| std::io::Error::other("poisoned"))?;
        *s.seen.entry(action.clone()).or_default() += 1;
        s.answers
            .iter_mut()
            .find(|a| {
                a.action == action && a.times > 0 && a.when.as_ref().is_none_or(|(k, v)| form.iter().any(|(fk, fv)| fk == k && fv == v))
            })
            .map(|a| {
                a.times -= 1;
                (a.status, a.body.clone())
            })
    };
    if let Some((status, body)) = scripted {
        return Response::builder()
            .status(status)
            .header("content-type", "text/xml")
            .body(Full::new(Bytes::from(body)))
            .map_err(std::io::Error::other);
    }
    let mut forward = client.post(format!("{upstream}{}", parts.uri.path())).body(body.to_vec());
    for (name, value) in &parts.headers {
        if name != "content-length" {
            forward = forward.header(name, value);
        }
    }
    let answer = forward.send().await.map_err(std::io::Error::other)?;
    let status = answer.status().as_u16();
    let bytes = answer.bytes().await.map_err(std::io::Error::other)?;
    Response::builder().status(status).header("content-type", "text/xml").body(Full::new(bytes)).map_err(std::io::Error::other)
}
