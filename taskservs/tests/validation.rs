//! Requests checked against the catalog: versions, config schemas, defaults.

use provisioning_taskservs::{Catalog, ValidationError};
use serde_json::json;

fn catalog() -> Catalog {
    Catalog::load(&Catalog::default_dir()).expect("catalog loads")
}

#[test]
fn default_version_and_schema_defaults() {
    let resolved = catalog().validate_request("etcd", None, &json!({})).expect("valid");
    assert_eq!(resolved.version, "3.4.23");
    assert_eq!(resolved.config["clientPort"], 2379);
    assert_eq!(resolved.config["dataDir"], "/var/lib/etcd/provisioning");
    assert_eq!(resolved.timeout.as_secs(), 300);
    // null config means "no config".
    let resolved = catalog().validate_request("redis", Some("7.0"), &serde_json::Value::Null).expect("valid");
    assert_eq!(resolved.version, "7.0");
    assert_eq!(resolved.config["port"], 6379);
}

#[test]
fn unknown_version_lists_the_available_ones() {
    let err = catalog().validate_request("redis", Some("6.2"), &json!({})).expect_err("unknown version");
    assert_eq!(
        err,
        ValidationError::UnknownVersion { service: "redis".into(), version: "6.2".into(), available: vec!["7.0.15".into(), "7.0".into()] }
    );
    assert_eq!(err.to_string(), "service redis has no version \"6.2\" (available: 7.0.15, 7.0)");
}

#[test]
fn unknown_service() {
    let err = catalog().validate_request("mongodb", None, &json!({})).expect_err("unknown");
    assert_eq!(err, ValidationError::UnknownService("mongodb".into()));
}

#[test]
fn schema_errors_carry_pointer_and_reason() {
    let err = catalog().validate_request("etcd", None, &json!({"clientPort": "x", "peerPort": 70000, "colour": 1})).expect_err("invalid");
    let ValidationError::InvalidConfig { service, violations } = &err else { panic!("{err:?}") };
    assert_eq!(service, "etcd");
    let pointers: Vec<&str> = violations.iter().map(|v| v.pointer.as_str()).collect();
    assert!(pointers.contains(&"/clientPort"), "{violations:?}");
    assert!(pointers.contains(&"/peerPort"), "{violations:?}");
    assert!(pointers.contains(&""), "additionalProperties is reported on the config itself: {violations:?}");
    let text = err.to_string();
    // The path and the rule, never the value (it might be a password).
    assert!(text.contains("at /clientPort: the value is not of type \"integer\""), "{text}");
    assert!(text.contains("at /peerPort: the value is greater than the maximum of 65535"), "{text}");
    assert!(!text.contains("70000"), "{text}");
    assert!(text.contains("colour"), "{text}");
}

#[test]
fn nested_and_array_pointers() {
    let err = catalog()
        .validate_request(
            "haproxy",
            None,
            &json!({"backends": [{"name": "a", "address": "10.0.0.1"}, {"name": "b; rm -rf /", "address": "x"}]}),
        )
        .expect_err("invalid backend name");
    let ValidationError::InvalidConfig { violations, .. } = err else { panic!() };
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].pointer, "/backends/1/name");
}

#[test]
fn hostile_values_the_schema_allows_stay_data() {
    // postgresql's password is free text: the schema accepts anything, the scripts treat it as data.
    let config = json!({"user": "app", "password": "$(reboot); rm -rf / \"'\n"});
    let resolved = catalog().validate_request("postgresql", None, &config).expect("valid");
    assert_eq!(resolved.config["password"], "$(reboot); rm -rf / \"'\n");
    // redis's password is quoted and escaped in redis.conf (conf_quote), so it may hold
    // anything; only an empty one is refused (redis always requires a password).
    let hostile = "a\"b\\\nrequirepass x";
    let resolved = catalog().validate_request("redis", None, &json!({"password": hostile})).expect("valid");
    assert_eq!(resolved.config["password"], hostile);
    assert!(catalog().validate_request("redis", None, &json!({"password": ""})).is_err());
}

#[test]
fn required_fields_of_cloud_services() {
    let err = catalog().validate_request("kubernetes", None, &json!({})).expect_err("token required");
    assert!(err.to_string().contains("\"bootstrapToken\" is a required property"), "{err}");
    let ok = json!({"bootstrapToken": "abcdef.0123456789abcdef", "certificateKey": "a".repeat(64),
        "caKey": "-----BEGIN PRIVATE KEY-----\nnot checked further\n-----END PRIVATE KEY-----\n"});
    assert_eq!(catalog().validate_request("kubernetes", Some("1.32.1"), &ok).expect("valid").version, "1.32.1");
}

#[test]
fn schema_errors_name_the_path_and_rule_never_the_value() {
    // kubeadm's bootstrap token has a pattern: an error must not publish the value.
    let secret = "hunter2 \"NEVER-IN-A-MESSAGE\"";
    let err = catalog().validate_request("kubernetes", None, &json!({"bootstrapToken": secret})).expect_err("breaks the pattern");
    let text = err.to_string();
    assert!(!text.contains("NEVER-IN-A-MESSAGE") && !text.contains("hunter2"), "{text}");
    assert!(text.contains("/bootstrapToken") && text.contains("match"), "{text}");
    let err = catalog().validate_request("redis", None, &json!({"password": "x", "port": 99999})).expect_err("port too large");
    let text = err.to_string();
    // Non-secret values are masked too (one rule for all): the path and the limit say enough.
    assert!(text.contains("/port") && !text.contains("99999"), "{text}");
}

#[test]
fn secret_fields_are_found_and_partial_validation_skips_required() {
    let catalog = catalog();
    let fields = |name: &str| -> Vec<(String, provisioning_taskservs::SecretFormat)> {
        catalog.get(name).expect("service").secret_fields().into_iter().map(|f| (f.dotted(), f.format)).collect()
    };
    use provisioning_taskservs::SecretFormat::*;
    assert_eq!(fields("redis"), [("password".to_string(), Password)]);
    assert_eq!(fields("postgresql"), [("password".to_string(), Password)]);
    assert_eq!(
        fields("kubernetes"),
        [("bootstrapToken".to_string(), KubeadmToken), ("caKey".to_string(), EcP256Pem), ("certificateKey".to_string(), Hex64)]
    );
    // A Cluster checks what it has; the TaskServ adds the secrets later.
    catalog.validate_partial_request("kubernetes", None, &json!({})).expect("required fields may come later");
    catalog
        .validate_partial_request("kubernetes", None, &json!({"bootstrapToken": "nope"}))
        .expect_err("what is there must still be valid");
}
