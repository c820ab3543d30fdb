//! Completes a script context for manual runs: reads a partial `ScriptContext` (JSON) on
//! stdin, validates `taskserv.service`/`taskserv.version`/`config` against the catalog (schema
//! defaults filled in), renders the templates and prints the JSON a script gets on stdin.
//!
//! cargo run -p provisioning-taskservs --example context < partial.json > ctx.json
//! docker exec -i NODE /usr/local/bin/nu --no-config-file --stdin /opt/provisioning/catalog/redis/install.nu < ctx.json

use std::io::Read;

use provisioning_taskservs::{Catalog, ScriptContext};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let mut ctx: ScriptContext = serde_json::from_str(&input)?;
    let catalog = Catalog::load(&Catalog::default_dir())?;
    let version = Some(ctx.taskserv.version.as_str()).filter(|v| !v.is_empty());
    let resolved = catalog.validate_request(&ctx.taskserv.service, version, &ctx.config)?;
    ctx.taskserv.version = resolved.version;
    ctx.config = resolved.config;
    let ctx = ctx.with_templates(&catalog)?;
    println!("{}", serde_json::to_string_pretty(&ctx)?);
    Ok(())
}
