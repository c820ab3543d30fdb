//! The decoder against bodies the real kubectl (v1.32) sent for its typed `create` commands,
//! each compared with the JSON the same command prints with `--dry-run=client -o json`
//! (fixtures in apiserver/tests/fixtures/protobuf), and against bodies encoded here.

use serde_json::{Value, json};

use crate::error::ApiError;

/// The decoder with a meter of its own (no shared budget).
fn decode(body: &[u8]) -> Result<Value, ApiError> {
    super::decode(body, &provisioning_yaml::bounded::Meter::unshared())
}

type R = Result<(), Box<dyn std::error::Error>>;

macro_rules! fixture {
    ($name:literal) => {
        (
            $name,
            &include_bytes!(concat!("../../tests/fixtures/protobuf/", $name, ".pb"))[..],
            include_str!(concat!("../../tests/fixtures/protobuf/", $name, ".json")),
        )
    };
}

/// kubectl's JSON without what JSON writes and protobuf cannot (`creationTimestamp: null`)
/// and without the empty status the server ignores on create.
fn normalized(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.into_iter().filter(|(k, v)| !v.is_null() && k != "status").map(|(k, v)| (k, normalized(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(normalized).collect()),
        other => other,
    }
}

#[test]
fn kubectl_create_bodies_decode_to_the_json_kubectl_would_send() -> R {
    for (name, pb, js) in [
        fixture!("deployment"),
        fixture!("deployment-cmd"),
        fixture!("service"),
        fixture!("service-nodeport"),
        fixture!("job"),
        fixture!("cronjob"),
        fixture!("role"),
        fixture!("clusterrole"),
        fixture!("rolebinding"),
        fixture!("clusterrolebinding"),
        fixture!("serviceaccount"),
        fixture!("configmap"),
        fixture!("secret"),
        fixture!("namespace"),
        fixture!("quota"),
        fixture!("pdb"),
    ] {
        let got = decode(pb).map_err(|e| format!("{name}: {}", e.message))?;
        let want = normalized(serde_json::from_str(js)?);
        assert_eq!(got, want, "{name}");
    }
    Ok(())
}

// A tiny encoder for the cases kubectl does not send.
fn key(n: u64, wire: u64) -> Vec<u8> {
    varint((n << 3) | wire)
}
fn varint(mut v: u64) -> Vec<u8> {
    let mut out = vec![];
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}
fn bytes(n: u64, payload: &[u8]) -> Vec<u8> {
    [key(n, 2), varint(payload.len() as u64), payload.to_vec()].concat()
}
fn int(n: u64, v: i64) -> Vec<u8> {
    [key(n, 0), varint(v as u64)].concat()
}
fn object(api_version: &str, kind: &str, obj: &[u8]) -> Vec<u8> {
    let tm = [bytes(1, api_version.as_bytes()), bytes(2, kind.as_bytes())].concat();
    [b"k8s\x00".to_vec(), bytes(1, &tm), bytes(2, obj)].concat()
}

fn err(body: &[u8]) -> Result<ApiError, Box<dyn std::error::Error>> {
    match decode(body) {
        Ok(v) => Err(format!("decoded, expected an error: {v}").into()),
        Err(e) => Ok(e),
    }
}

#[test]
fn well_known_types_decode_like_their_json() -> R {
    let meta = [bytes(1, b"d"), bytes(8, &[int(1, 1_700_000_000), int(2, 5)].concat())].concat();
    let rolling = [bytes(1, &[int(1, 1), bytes(3, b"25%")].concat()), bytes(2, &[int(1, 0), int(2, 2)].concat())].concat();
    let strategy = [bytes(1, b"RollingUpdate"), bytes(2, &rolling)].concat();
    let limits = [bytes(1, b"cpu"), bytes(2, &bytes(1, b"500m"))].concat();
    let container = [bytes(1, b"c"), bytes(2, b"img"), bytes(8, &bytes(1, &limits))].concat();
    let template = bytes(2, &bytes(2, &container));
    // replicas 0 is kept (a pointer upstream); revisionHistoryLimit -1 stays negative.
    let spec = [int(1, 0), bytes(3, &template), bytes(4, &strategy), int(6, -1)].concat();
    let v = decode(&object("apps/v1", "Deployment", &[bytes(1, &meta), bytes(2, &spec)].concat()))?;
    assert_eq!(v["metadata"], json!({"name": "d", "creationTimestamp": "2023-11-14T22:13:20Z"}));
    assert_eq!(v["spec"]["replicas"], 0);
    assert_eq!(v["spec"]["revisionHistoryLimit"], -1);
    assert_eq!(v["spec"]["strategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 2}}));
    assert_eq!(v["spec"]["template"]["spec"]["containers"][0]["resources"], json!({"limits": {"cpu": "500m"}}));
    // An env var from a ConfigMap key: the embedded LocalObjectReference is inlined as `name`.
    let key_sel = [bytes(1, &bytes(1, b"cfg")), bytes(2, b"k")].concat();
    let env = [bytes(1, b"E"), bytes(3, &bytes(3, &key_sel))].concat();
    let pod_spec = bytes(2, &[bytes(1, b"c"), bytes(7, &env)].concat());
    let v = decode(&object("v1", "Pod", &[bytes(1, &bytes(1, b"p")), bytes(2, &pod_spec)].concat()))?;
    assert_eq!(v["spec"]["containers"][0]["env"], json!([{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}]));
    Ok(())
}

#[test]
fn unknown_fields_are_refused_naming_message_and_field() -> R {
    // Container field 15 (securityContext) is not in our table: 415, not dropped.
    let container = [bytes(1, b"c"), bytes(15, &int(1, 1))].concat();
    let spec = bytes(3, &bytes(2, &bytes(2, &container)));
    let e = err(&object("apps/v1", "Deployment", &[bytes(1, &bytes(1, b"d")), bytes(2, &spec)].concat()))?;
    assert_eq!(e.code, 415);
    assert_eq!(e.message, "protobuf field 15 of Container is not supported by this server; send application/json");
    // A field number no version of ObjectMeta has.
    let e = err(&object("v1", "ConfigMap", &bytes(1, &bytes(99, b"x"))))?;
    assert_eq!(
        (e.code, e.message.as_str()),
        (415, "protobuf field 99 of ObjectMeta is not supported by this server; send application/json")
    );
    // A status someone filled in is not ignored silently either.
    let e = err(&object("batch/v1", "Job", &[bytes(1, &bytes(1, b"j")), bytes(3, &int(4, 3))].concat()))?;
    assert_eq!(e.code, 415, "{}", e.message);
    assert!(e.message.contains("Job status"), "{}", e.message);
    // Kinds the table does not have, or other versions of the ones it has, stay 415.
    for (av, kind) in [("apps/v1", "StatefulSet"), ("apps/v1beta2", "Deployment")] {
        let e = err(&object(av, kind, &bytes(1, &bytes(1, b"x"))))?;
        assert_eq!(e.code, 415, "{av} {kind}");
        assert!(e.message.contains(kind) && e.message.contains("application/json"), "{}", e.message);
    }
    Ok(())
}

#[test]
fn malformed_bodies_are_bad_requests_not_panics() -> R {
    let meta = bytes(1, &bytes(1, b"d"));
    for (what, body) in [
        ("no magic", b"{}".to_vec()),
        ("truncated object", object("apps/v1", "Deployment", &meta)[..20].to_vec()),
        ("name as a number", object("v1", "ConfigMap", &bytes(1, &int(1, 5)))),
        ("replicas as bytes", object("apps/v1", "Deployment", &[meta.clone(), bytes(2, &bytes(1, b"3"))].concat())),
        ("label key not UTF-8", object("v1", "ConfigMap", &bytes(1, &bytes(11, &bytes(1, &[0xff]))))),
    ] {
        let e = err(&body)?;
        assert_eq!(e.code, 400, "{what}: {}", e.message);
    }
    // A status nested deeper than the zero check looks is refused, without deep recursion.
    let mut deep = vec![];
    for _ in 0..200 {
        deep = bytes(1, &deep);
    }
    let e = err(&object("batch/v1", "Job", &[meta, bytes(3, &deep)].concat()))?;
    assert_eq!(e.code, 415);
    Ok(())
}
