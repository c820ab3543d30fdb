//! User catalogs: several directories merged into one catalog (later ones override earlier
//! ones by service name, only when the operator opts in), checked at load (regular files
//! only), materialized as one tree that scripts run from.

mod common;

use std::time::Duration;

use common::{manifest, nu, write_service, write_tree};
use provisioning_taskservs::{Catalog, LocalProcessExecutor, ScriptContext, ScriptStep, run_script};
use serde_json::json;

#[test]
fn a_user_service_is_added_and_a_built_in_one_overridden_with_its_source() {
    let user = tempfile::tempdir().expect("tempdir");
    write_service(user.path(), "hello", &manifest("hello", "requires: [redis]\n"));
    write_service(user.path(), "redis", &manifest("redis", "").replace("test service redis", "my own redis"));
    let builtin = Catalog::default_dir();
    let redis = ["redis".to_string()];
    let catalog = Catalog::load_layers_allowing(&[builtin.clone(), user.path().to_path_buf()], &redis).expect("merged catalog loads");
    assert_eq!(catalog.layers(), [builtin.clone(), user.path().to_path_buf()]);
    assert_eq!(catalog.source_of("hello"), Some(user.path()));
    assert_eq!(catalog.source_of("redis"), Some(user.path()));
    assert_eq!(catalog.get("redis").map(|s| s.manifest.description.as_str()), Some("my own redis"));
    assert_eq!(catalog.source_of("etcd"), Some(builtin.as_path()));
    assert_eq!(catalog.resolve(&["hello".to_string()]).expect("resolves"), ["redis", "hello"]);
    // Order matters: the built-in catalog last would override the user's redis again.
    let reversed = Catalog::load_layers_allowing(&[user.path().to_path_buf(), builtin.clone()], &redis).expect("loads");
    assert_eq!(reversed.source_of("redis"), Some(builtin.as_path()));
}

#[test]
fn a_broken_user_catalog_fails_naming_the_file() {
    let builtin = Catalog::default_dir();
    let load = |setup: &dyn Fn(&std::path::Path)| {
        let user = tempfile::tempdir().expect("tempdir");
        setup(user.path());
        Catalog::load_layers(&[builtin.clone(), user.path().to_path_buf()]).expect_err("refused").to_string()
    };
    let e = Catalog::load_layers(&[builtin.clone(), "/no/such/catalog".into()]).expect_err("missing").to_string();
    assert!(e.contains("/no/such/catalog") && e.contains("does not exist"), "{e}");
    let e = load(&|d| write_tree(d, &[("bad/taskserv.yaml", "name: bad\ndescription: [unclosed\n")]));
    assert!(e.contains("bad/taskserv.yaml") && e.contains("invalid manifest"), "{e}");
    let e = load(&|d| {
        write_service(d, "svc", &manifest("svc", ""));
        std::fs::remove_file(d.join("svc/remove.nu")).expect("rm");
    });
    assert!(e.contains("svc/remove.nu") && e.contains("script is missing"), "{e}");
    let e = load(&|d| write_service(d, "svc", &manifest("svc", "requires: [redis, redis]\n")));
    assert!(e.contains("svc/taskserv.yaml") && e.contains("requires lists \"redis\" twice"), "{e}");
    let e = load(&|d| {
        write_service(d, "a", &manifest("a", "requires: [b]\n"));
        write_service(d, "b", &manifest("b", "requires: [a]\n"));
    });
    assert!(e.contains("a/taskserv.yaml") && e.contains("dependency cycle: a -> b -> a"), "{e}");
    let e = load(&|d| write_service(d, "svc", &manifest("svc", "requires: [ghost]\n")));
    assert!(e.contains("svc/taskserv.yaml") && e.contains("\"ghost\", which is not in the catalog"), "{e}");
}

#[test]
fn materialize_syncs_one_tree_in_place() {
    let user = tempfile::tempdir().expect("tempdir");
    write_service(user.path(), "redis", &manifest("redis", ""));
    write_tree(user.path(), &[("lib/mine.nu", "export def hi [] { 'hi' }\n")]);
    let catalog = Catalog::load_layers_allowing(&[Catalog::default_dir(), user.path().to_path_buf()], &["redis".into()]).expect("loads");
    let out = tempfile::tempdir().expect("tempdir");
    let dest = out.path().join("catalog");
    std::fs::create_dir_all(dest.join("stale")).expect("mkdir");
    std::fs::write(dest.join("stale/old.nu"), "x").expect("write");
    catalog.materialize(&dest).expect("materialized");
    assert!(dest.join("etcd/install.nu").is_file() && dest.join("etcd/templates").is_dir());
    assert!(dest.join("lib/ctx.nu").is_file() && dest.join("lib/mine.nu").is_file());
    assert_eq!(std::fs::read_to_string(dest.join("redis/check.nu")).expect("read"), "def main [] {}\n", "the user's redis");
    assert!(!dest.join("redis/common.nu").exists(), "nothing of the overridden built-in redis");
    assert!(!dest.join("stale").exists(), "stale files and directories removed");
    // A change in the user's catalog lands in the same directory.
    std::fs::write(user.path().join("redis/check.nu"), "def main [] { print changed }\n").expect("write");
    catalog.materialize(&dest).expect("again");
    assert!(std::fs::read_to_string(dest.join("redis/check.nu")).expect("read").contains("changed"));
}

#[test]
fn replacing_a_built_in_service_or_lib_file_needs_the_operators_opt_in() {
    let builtin = Catalog::default_dir();
    let user = tempfile::tempdir().expect("tempdir");
    write_service(user.path(), "redis", &manifest("redis", ""));
    let layers = [builtin.clone(), user.path().to_path_buf()];
    let e = Catalog::load_layers(&layers).expect_err("refused").to_string();
    assert!(e.contains(&user.path().join("redis").display().to_string()), "{e}");
    assert!(e.contains(r#"replaces service "redis""#) && e.contains("catalog_overrides"), "{e}");
    Catalog::load_layers_allowing(&layers, &["redis".into()]).expect("allowed by name");
    let e = Catalog::load_layers_allowing(&layers, &["etcd".into()]).expect_err("only the named service").to_string();
    assert!(e.contains(r#"replaces service "redis""#), "{e}");

    let lib = tempfile::tempdir().expect("tempdir");
    write_tree(lib.path(), &[("lib/ctx.nu", "export def read-context [] { $in }\n")]);
    let layers = [builtin.clone(), lib.path().to_path_buf()];
    let e = Catalog::load_layers(&layers).expect_err("refused").to_string();
    assert!(e.contains("lib/ctx.nu") && e.contains("replaces") && e.contains(r#"add "lib""#), "{e}");
    Catalog::load_layers_allowing(&layers, &["lib".into()]).expect("allowed");
}

#[test]
fn catalogs_accept_regular_files_only() {
    let builtin = Catalog::default_dir();
    let secret = tempfile::tempdir().expect("tempdir");
    let key = secret.path().join("sa.key");
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").expect("write");
    let load = |setup: &dyn Fn(&std::path::Path)| {
        let user = tempfile::tempdir().expect("tempdir");
        write_service(user.path(), "svc", &manifest("svc", ""));
        setup(user.path());
        let e = Catalog::load_layers(&[builtin.clone(), user.path().to_path_buf()]).expect_err("refused").to_string();
        (e, user)
    };
    let link = |to: &std::path::Path, at: std::path::PathBuf| std::os::unix::fs::symlink(to, at).expect("symlink");
    // A symlinked file in a service, its templates, its scripts, in lib/; a symlinked lib/.
    for (rel, target_is_dir) in
        [("svc/key.pem", false), ("svc/templates/key.tpl", false), ("svc/check.nu", false), ("lib/key.nu", false), ("lib", true)]
    {
        let (e, user) = load(&|d| {
            let at = d.join(rel);
            std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
            let _ = std::fs::remove_file(&at);
            link(if target_is_dir { secret.path() } else { &key }, at);
        });
        let at = user.path().join(rel).display().to_string();
        assert!(e.contains(&at) && e.contains("is a symbolic link; catalogs accept regular files and directories only"), "{rel}: {e}");
    }
    // A FIFO.
    let (e, _user) = load(&|d| {
        let status = std::process::Command::new("mkfifo").arg(d.join("svc/pipe")).status().expect("mkfifo");
        assert!(status.success());
    });
    assert!(e.contains("svc/pipe") && e.contains("is a FIFO"), "{e}");
    // Nothing of it reaches a materialized tree: the load already failed. A catalog loaded
    // before the link appeared refuses to materialize it too.
    let user = tempfile::tempdir().expect("tempdir");
    write_service(user.path(), "svc", &manifest("svc", ""));
    let catalog = Catalog::load_layers(&[builtin.clone(), user.path().to_path_buf()]).expect("loads");
    link(&key, user.path().join("svc/key.pem"));
    let out = tempfile::tempdir().expect("tempdir");
    let e = catalog.materialize(out.path()).expect_err("refused").to_string();
    assert!(e.contains("svc/key.pem") && e.contains("symbolic link"), "{e}");
    assert!(!out.path().join("svc/key.pem").exists());
}

/// A user service that uses the built-in `lib/` runs through the runner from the
/// materialized tree, with its own template rendered into the context.
#[tokio::test]
async fn a_user_service_runs_through_the_runner() {
    let user = tempfile::tempdir().expect("tempdir");
    let body = "use ../lib/ctx.nu *\ndef main [] {\n  let ctx = ($in | read-context)\n  \
                emit-result {greeting: ($ctx.templates.\"greeting.txt\" | str trim), version: $ctx.taskserv.version}\n}\n";
    write_tree(
        user.path(),
        &[
            (
                "hello/taskserv.yaml",
                &manifest("hello", "configSchema: {type: object, properties: {name: {type: string, default: world}}}\n"),
            ),
            ("hello/install.nu", body),
            ("hello/check.nu", body),
            ("hello/remove.nu", body),
            ("hello/templates/greeting.txt", "hello {{ config.name }}\n"),
        ],
    );
    let catalog = Catalog::load_layers(&[Catalog::default_dir(), user.path().to_path_buf()]).expect("loads");
    let out = tempfile::tempdir().expect("tempdir");
    catalog.materialize(out.path()).expect("materialized");
    let resolved = catalog.validate_request("hello", None, &json!({"name": "user catalogs"})).expect("valid");
    let mut ctx = ScriptContext::default();
    ctx.server.name = "node-0".into();
    ctx.taskserv.service = "hello".into();
    ctx.taskserv.version = resolved.version.clone();
    ctx.config = resolved.config;
    let ctx = ctx.with_templates(&catalog).expect("renders");
    let exec = LocalProcessExecutor::new(nu().to_string_lossy(), out.path().to_string_lossy());
    let outcome = run_script(&exec, ScriptStep::Install, "hello", &ctx, Duration::from_secs(60), None).await.expect("runs");
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.result, Some(json!({"greeting": "hello user catalogs", "version": "1.0"})), "{outcome:?}");
}
