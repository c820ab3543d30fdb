//! Runs Argo CD health and action scripts in a real Lua 5.1 interpreter (Debian's `lua5.1`),
//! in the sandbox a check added through `argocd-cm` gets: no `string`, `math`, `io` or `debug`
//! library (not even through `require` or string methods), and Argo's "safe" `os` (clock,
//! date, difftime, time) with the clock pinned so action outputs are reproducible.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;
use serde_json::{Map, Value};

/// The instant the sandbox's `os.time()`/`os.date()` report: 2024-05-01T12:00:00Z.
pub const FIXED_EPOCH_SECONDS: i64 = 1_714_564_800;

/// Failures of running a script.
#[derive(Debug, thiserror::Error)]
pub enum LuaError {
    /// No Lua 5.1 interpreter: tests must fail, not skip (CI installs it via scripts/setup.sh).
    #[error("no Lua 5.1 interpreter found (looked at $LUA51, lua5.1 on PATH, .tools/bin, /usr/bin); run scripts/setup.sh: {0}")]
    NotFound(String),
    #[error("could not run {binary}: {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("{binary} is not Lua 5.1: {version}")]
    WrongVersion { binary: PathBuf, version: String },
    #[error("the Lua harness failed (exit {status}): {stderr}")]
    Harness { status: String, stderr: String },
    #[error("the harness printed something that is not JSON: {0}")]
    Output(String),
    /// The script itself raised an error (in Argo CD this surfaces as an error on the resource).
    #[error("script {name} raised: {message}")]
    Script { name: String, message: String },
    #[error("script {name} returned {found}, expected {expected}")]
    ReturnType { name: String, expected: &'static str, found: String },
}

/// A located, version-checked Lua 5.1 interpreter.
#[derive(Debug, Clone)]
pub struct Lua51 {
    binary: PathBuf,
}

/// What a health script returns (Argo CD's `HealthStatus`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct HealthStatus {
    pub status: String,
    #[serde(default)]
    pub message: String,
}

/// One action offered by a discovery script (Argo CD's `ResourceAction`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceAction {
    pub name: String,
    #[serde(default)]
    pub disabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icon_class: Option<String>,
}

/// The statuses Argo CD accepts from a health script; anything else becomes `Unknown`.
pub const VALID_HEALTH_STATUSES: [&str; 6] = ["Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing"];

impl Lua51 {
    /// Finds the interpreter: `$LUA51`, then `lua5.1` on `PATH`, then the project's `.tools/bin`,
    /// then `/usr/bin/lua5.1`; checks that it reports Lua 5.1.
    pub fn locate() -> Result<Self, LuaError> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(explicit) = std::env::var_os("LUA51") {
            candidates.push(PathBuf::from(explicit));
        }
        if let Some(path) = std::env::var_os("PATH") {
            candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("lua5.1")));
        }
        candidates.push(crate::workspace_root().join(".tools/bin/lua5.1"));
        candidates.push(PathBuf::from("/usr/bin/lua5.1"));
        let binary = candidates
            .iter()
            .find(|candidate| candidate.is_file())
            .cloned()
            .ok_or_else(|| LuaError::NotFound(candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")))?;
        let output = Command::new(&binary).arg("-v").output().map_err(|source| LuaError::Spawn { binary: binary.clone(), source })?;
        // lua5.1 -v prints its banner on stdout or stderr depending on the build.
        let version = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        if !version.contains("Lua 5.1") {
            return Err(LuaError::WrongVersion { binary, version: version.trim().to_owned() });
        }
        Ok(Self { binary })
    }

    /// The interpreter's path.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Runs `script` with the global `obj` set to `obj`, in Argo's sandbox; returns what the
    /// script returned, as JSON (Lua tables become arrays when their keys are 1..n, objects
    /// otherwise; an empty table becomes `[]`, as with gopher-json).
    pub fn run(&self, name: &str, script: &str, obj: &Value) -> Result<Value, LuaError> {
        let harness = harness(name, script, obj);
        let mut child = Command::new(&self.binary)
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| LuaError::Spawn { binary: self.binary.clone(), source })?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(harness.as_bytes()).map_err(|source| LuaError::Spawn { binary: self.binary.clone(), source })?;
        }
        let output = child.wait_with_output().map_err(|source| LuaError::Spawn { binary: self.binary.clone(), source })?;
        if !output.status.success() {
            return Err(LuaError::Harness {
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let reply: Value = serde_json::from_str(&stdout).map_err(|_| LuaError::Output(stdout.clone().into_owned()))?;
        if let Some(message) = reply.get("error") {
            return Err(LuaError::Script { name: name.to_owned(), message: message.as_str().unwrap_or_default().to_owned() });
        }
        Ok(reply.get("result").cloned().unwrap_or(Value::Null))
    }

    /// Runs a health script the way Argo CD does: it must return a table with a valid status.
    pub fn health(&self, name: &str, script: &str, obj: &Value) -> Result<HealthStatus, LuaError> {
        let result = self.run(name, script, obj)?;
        if !result.is_object() {
            return Err(LuaError::ReturnType {
                name: name.to_owned(),
                expected: "a table with status and message",
                found: result.to_string(),
            });
        }
        let health: HealthStatus = serde_json::from_value(result.clone()).map_err(|_| LuaError::ReturnType {
            name: name.to_owned(),
            expected: "a table with status and message",
            found: result.to_string(),
        })?;
        if !VALID_HEALTH_STATUSES.contains(&health.status.as_str()) {
            // Argo CD's own behaviour for an invalid status code.
            return Ok(HealthStatus { status: "Unknown".into(), message: "Lua returned an invalid health status".into() });
        }
        Ok(health)
    }

    /// Runs a discovery script: a table of action name to `{disabled, displayName, iconClass}`.
    pub fn discovery(&self, name: &str, script: &str, obj: &Value) -> Result<Vec<ResourceAction>, LuaError> {
        let result = self.run(name, script, obj)?;
        let mut actions = Vec::new();
        match result {
            // An empty table: no actions.
            Value::Array(items) if items.is_empty() => {}
            Value::Object(map) => {
                for (action_name, spec) in map {
                    let mut action = ResourceAction { name: action_name.clone(), disabled: false, display_name: None, icon_class: None };
                    if let Value::Object(fields) = spec {
                        action.disabled = fields.get("disabled").and_then(Value::as_bool).unwrap_or(false);
                        action.display_name = fields.get("displayName").and_then(Value::as_str).map(str::to_owned);
                        action.icon_class = fields.get("iconClass").and_then(Value::as_str).map(str::to_owned);
                    }
                    actions.push(action);
                }
            }
            other => {
                return Err(LuaError::ReturnType { name: name.to_owned(), expected: "a table of actions", found: other.to_string() });
            }
        }
        actions.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(actions)
    }

    /// Runs an action script that returns the modified object (Argo's "old style" patch action)
    /// and cleans empty tables back into the maps they were, as Argo CD does.
    pub fn action(&self, name: &str, script: &str, obj: &Value) -> Result<Value, LuaError> {
        let result = self.run(name, script, obj)?;
        match result {
            Value::Object(new_obj) => {
                let original = obj.as_object().cloned().unwrap_or_default();
                Ok(Value::Object(clean_returned_obj(new_obj, &original)))
            }
            other => Err(LuaError::ReturnType { name: name.to_owned(), expected: "the modified object", found: other.to_string() }),
        }
    }
}

/// Argo CD's `cleanReturnedObj`: Lua cannot tell an empty map from an empty list, so where the
/// original held a map and the script returned `[]`, the map comes back.
fn clean_returned_obj(mut new_obj: Map<String, Value>, original: &Map<String, Value>) -> Map<String, Value> {
    for (key, old_value) in original {
        let Some(new_value) = new_obj.get_mut(key) else {
            continue;
        };
        match (new_value, old_value) {
            (Value::Object(new_map), Value::Object(old_map)) => {
                let cleaned = clean_returned_obj(std::mem::take(new_map), old_map);
                *new_map = cleaned;
            }
            (new_value @ Value::Array(_), Value::Object(old_map)) if new_value.as_array().is_some_and(Vec::is_empty) => {
                *new_value = Value::Object(old_map.clone());
            }
            (Value::Array(new_items), Value::Array(old_items)) => {
                for (new_item, old_item) in new_items.iter_mut().zip(old_items) {
                    if let (Value::Object(new_map), Value::Object(old_map)) = (new_item, old_item) {
                        let cleaned = clean_returned_obj(std::mem::take(new_map), old_map);
                        *new_map = cleaned;
                    }
                }
            }
            _ => {}
        }
    }
    new_obj
}

/// A Lua string literal holding `text` byte for byte (decimal escapes for anything unusual).
fn lua_string(text: &str) -> String {
    let mut literal = String::with_capacity(text.len() + 2);
    literal.push('"');
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b" .,:;_-+*/=<>()[]{}!?#@$%&|~^'`".contains(&byte) {
            literal.push(char::from(byte));
        } else {
            literal.push_str(&format!("\\{byte}"));
        }
    }
    literal.push('"');
    literal
}

/// A Lua table constructor for a JSON value, the way Argo CD decodes objects (null is nil).
fn lua_value(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => format!("{f:?}"),
            _ => "nil".into(),
        },
        Value::String(s) => lua_string(s),
        Value::Array(items) => {
            let fields: Vec<String> = items.iter().enumerate().map(|(i, item)| format!("[{}]={}", i + 1, lua_value(item))).collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Object(map) => {
            let fields: Vec<String> =
                map.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| format!("[{}]={}", lua_string(k), lua_value(v))).collect();
            format!("{{{}}}", fields.join(","))
        }
    }
}

/// The harness program: captures what it needs, removes the libraries, runs the script,
/// prints `{"result": ...}` or `{"error": "..."}` as JSON.
// Over 80 lines on purpose: it returns one Lua program as text (a template), not logic.
fn harness(name: &str, script: &str, obj: &Value) -> String {
    format!(
        r#"
local format, gsub, byte, write = string.format, string.gsub, string.byte, io.write
local floor, concat, sort = math.floor, table.concat, table.sort
local real_date, real_difftime, real_time = os.date, os.difftime, os.time
local FIXED = {fixed}

-- Argo CD's safe os library, with the clock pinned.
local safe_os = {{
  clock = function() return 0 end,
  date = function(fmt, t) return real_date(fmt, t or FIXED) end,
  difftime = real_difftime,
  time = function(t) if t == nil then return FIXED end return real_time(t) end,
}}

-- The sandbox: no string, math, io or debug library, by name, through require, or as
-- string methods (s:sub() works in PUC Lua even with `string` gone; not in Argo's VM).
string, math, io, debug = nil, nil, nil, nil
package.loaded.string, package.loaded.math, package.loaded.io, package.loaded.debug = nil, nil, nil, nil
package.loaded.os = safe_os
os = safe_os
getmetatable("").__index = nil

local encode
local function encode_string(s)
  return '"' .. gsub(s, '[%c"\\]', function(c) return format("\\u%04x", byte(c)) end) .. '"'
end
encode = function(v)
  local t = type(v)
  if v == nil then return "null"
  elseif t == "boolean" then return tostring(v)
  elseif t == "number" then
    if v == floor(v) and v > -9007199254740992 and v < 9007199254740992 then return format("%d", v) end
    return format("%.17g", v)
  elseif t == "string" then return encode_string(v)
  elseif t == "table" then
    local count, max = 0, 0
    local is_array = true
    for k, _ in pairs(v) do
      count = count + 1
      if type(k) == "number" and k >= 1 and k == floor(k) then
        if k > max then max = k end
      else
        is_array = false
      end
    end
    if count == 0 then return "[]" end
    local parts = {{}}
    if is_array and max == count then
      for i = 1, max do parts[i] = encode(v[i]) end
      return "[" .. concat(parts, ",") .. "]"
    end
    local keys = {{}}
    for k, _ in pairs(v) do
      if type(k) ~= "string" then error("cannot encode a table key of type " .. type(k)) end
      keys[#keys + 1] = k
    end
    sort(keys)
    for i, k in ipairs(keys) do parts[i] = encode_string(k) .. ":" .. encode(v[k]) end
    return "{{" .. concat(parts, ",") .. "}}"
  else
    error("cannot encode a value of type " .. t)
  end
end

obj = {obj}
local chunk, load_error = loadstring({script}, {chunk_name})
if chunk == nil then
  write('{{"error":' .. encode_string(tostring(load_error)) .. '}}')
  return
end
local ok, result = pcall(chunk)
if not ok then
  write('{{"error":' .. encode_string(tostring(result)) .. '}}')
  return
end
local encoded_ok, encoded = pcall(encode, result)
if not encoded_ok then
  write('{{"error":' .. encode_string("the result cannot be encoded: " .. tostring(encoded)) .. '}}')
  return
end
write('{{"result":' .. encoded .. '}}')
"#,
        fixed = FIXED_EPOCH_SECONDS,
        obj = lua_value(obj),
        script = lua_string(script),
        chunk_name = lua_string(&format!("={name}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lua() -> Lua51 {
        match Lua51::locate() {
            Ok(lua) => lua,
            Err(error) => panic!("{error}"),
        }
    }

    #[test]
    fn the_sandbox_has_no_string_math_or_io() {
        let lua = lua();
        for probe in [
            "return string.len('x')",
            "return math.floor(1.5)",
            "return io.write('x')",
            "return debug.traceback()",
            "return require('string').len('x')",
            "return ('abc'):sub(1, 1)",
            "return obj.metadata.name:upper()",
        ] {
            let outcome = lua.run("probe", probe, &json!({"metadata": {"name": "a"}}));
            assert!(matches!(outcome, Err(LuaError::Script { .. })), "{probe} should fail in the sandbox, got {outcome:?}");
        }
    }

    #[test]
    fn base_table_and_safe_os_remain() {
        let lua = lua();
        let result = lua
            .run(
                "probe",
                "local t = {} table.insert(t, tonumber('3')) return {n = t[1], s = 'g' .. 2, d = os.date('!%Y-%m-%dT%H:%M:%SZ'), l = #obj.metadata.name}",
                &json!({"metadata": {"name": "abc"}}),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(result, json!({"n": 3, "s": "g2", "d": "2024-05-01T12:00:00Z", "l": 3}));
    }

    #[test]
    fn values_round_trip_through_lua() {
        let lua = lua();
        let obj = json!({
            "metadata": {"name": "weird \"name\"\n\\ é", "generation": 7, "labels": {}},
            "spec": {"ratio": 0.25, "list": [1, "two", {"three": true}], "empty": []}
        });
        let result = lua.action("probe", "return obj", &obj).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(result, obj);
    }

    #[test]
    fn script_errors_are_reported() {
        let lua = lua();
        let outcome = lua.run("broken", "return obj.status.conditions[1]", &json!({"metadata": {}}));
        assert!(matches!(outcome, Err(LuaError::Script { .. })), "{outcome:?}");
    }
}
