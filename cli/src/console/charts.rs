//! Inline SVG drawn on the server: a Cluster's steps as a timeline of bars, and its Servers
//! ready over time. Each state is also written as text (a symbol and a word in the label), so
//! the charts read without colour.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::html::esc;
use super::session::ReadyPoint;

/// Steps drawn at most; a larger rollout shows its latest ones and says how many are hidden.
pub const MAX_STEPS: usize = 150;

const WIDTH: f64 = 900.0;
const LABEL: f64 = 300.0;
const ROW: f64 = 18.0;

fn parse(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t).ok().map(|t| t.with_timezone(&Utc))
}

/// A word and a symbol for a step state.
pub fn step_symbol(state: &str) -> &'static str {
    match state {
        "Done" | "Succeeded" | "Completed" => "✔",
        "Running" => "▶",
        "Failed" | "Error" => "✖",
        _ => "…",
    }
}

fn seconds(d: chrono::Duration) -> String {
    let s = d.num_seconds().max(0);
    if s < 120 {
        format!("{s}s")
    } else if s < 7200 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{}h{}m", s / 3600, (s % 3600) / 60)
    }
}

/// The steps of `status.steps` as an SVG timeline (one bar per step from startedAt to
/// finishedAt, a running step up to `now`).
pub fn steps_timeline(steps: &[Value], now: DateTime<Utc>) -> String {
    if steps.is_empty() {
        return "<p class=\"muted\">No steps recorded yet.</p>".into();
    }
    let hidden = steps.len().saturating_sub(MAX_STEPS);
    let shown = &steps[hidden..];
    let span = |st: &Value| {
        let start = st["startedAt"].as_str().and_then(parse);
        let end = st["finishedAt"].as_str().and_then(parse).or_else(|| start.map(|_| now));
        (start, end)
    };
    let t0 = shown.iter().filter_map(|st| span(st).0).min();
    let t1 = shown.iter().filter_map(|st| span(st).1).max();
    let (t0, t1) = match (t0, t1) {
        (Some(a), Some(b)) => (a, b.max(a + chrono::Duration::seconds(1))),
        _ => (now, now + chrono::Duration::seconds(1)),
    };
    let total = (t1 - t0).num_milliseconds().max(1) as f64;
    let x = |t: DateTime<Utc>| LABEL + (t - t0).num_milliseconds() as f64 / total * (WIDTH - LABEL - 10.0);
    let height = ROW * shown.len() as f64 + 24.0;
    let mut out = String::with_capacity(shown.len() * 300 + 512);
    if hidden > 0 {
        out.push_str(&format!("<p class=\"muted\">Showing the latest {MAX_STEPS} of {} steps.</p>", steps.len()));
    }
    out.push_str(&format!(
        "<svg class=\"timeline\" role=\"img\" aria-labelledby=\"timeline-title\" viewBox=\"0 0 {WIDTH} {height}\" width=\"100%\">\
         <title id=\"timeline-title\">Steps from {} to {} ({})</title>",
        t0.format("%H:%M:%S"),
        t1.format("%H:%M:%S"),
        seconds(t1 - t0)
    ));
    for (i, st) in shown.iter().enumerate() {
        let y = ROW * i as f64;
        let state = st["state"].as_str().unwrap_or("Pending");
        let (kind, target) = (st["kind"].as_str().unwrap_or_default(), st["target"].as_str().unwrap_or_default());
        // Targets often name their kind already ("TaskServ etcd-etcd").
        let what = if target.starts_with(kind) { target.to_string() } else { format!("{kind} {target}") };
        let label = format!("{} {what}", step_symbol(state));
        let class = format!("bar s-{}", esc(&state.to_ascii_lowercase()));
        out.push_str(&format!("<g class=\"{class}\"><text x=\"0\" y=\"{:.1}\">{}</text>", y + 13.0, esc(&label)));
        if let (Some(start), Some(end)) = span(st) {
            let (x0, x1) = (x(start), x(end));
            out.push_str(&format!(
                "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{} {state}: {} ({}){}</title></rect>",
                y + 3.0,
                (x1 - x0).max(2.0),
                ROW - 6.0,
                esc(&label),
                start.format("%H:%M:%S"),
                seconds(end - start),
                esc(st["message"].as_str().map(|m| format!(" — {m}")).as_deref().unwrap_or_default()),
            ));
        }
        out.push_str("</g>");
    }
    let axis_y = height - 6.0;
    out.push_str(&format!(
        "<text class=\"axis\" x=\"{LABEL}\" y=\"{axis_y}\">{}</text><text class=\"axis\" x=\"{}\" y=\"{axis_y}\" text-anchor=\"end\">+{}</text></svg>",
        t0.format("%H:%M:%S"),
        WIDTH - 10.0,
        seconds(t1 - t0)
    ));
    out
}

/// Servers ready over time as a step line, with the desired count dashed; the last point is
/// carried to `now`.
pub fn ready_chart(points: &[ReadyPoint], now: DateTime<Utc>) -> String {
    let Some(first) = points.first() else {
        return "<p class=\"muted\">No data yet.</p>".into();
    };
    let (w, h, left, bottom) = (WIDTH, 160.0, 40.0, 20.0);
    let t0 = first.at;
    let t1 = now.timestamp().max(points.last().map_or(t0, |p| p.at)).max(t0 + 1);
    let ymax = points.iter().map(|p| p.ready.max(p.desired)).max().unwrap_or(1).max(1) as f64;
    let x = |t: i64| left + (t - t0) as f64 / (t1 - t0) as f64 * (w - left - 10.0);
    let y = |v: u32| 10.0 + (1.0 - v as f64 / ymax) * (h - bottom - 10.0);
    let path = |value: &dyn Fn(&ReadyPoint) -> u32| {
        let mut d = format!("M{:.1},{:.1}", x(t0), y(value(first)));
        for pair in points.windows(2) {
            d.push_str(&format!(" H{:.1} V{:.1}", x(pair[1].at), y(value(&pair[1]))));
        }
        d.push_str(&format!(" H{:.1}", x(t1)));
        d
    };
    let last = points.last().copied().unwrap_or(*first);
    format!(
        "<svg class=\"chart\" role=\"img\" aria-labelledby=\"ready-title\" viewBox=\"0 0 {w} {h}\" width=\"100%\">\
         <title id=\"ready-title\">Servers ready over time: now {} of {}</title>\
         <line class=\"grid\" x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>\
         <path class=\"desired\" d=\"{}\"/><path class=\"ready\" d=\"{}\"/>\
         <text class=\"axis\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
         <text class=\"axis\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">0</text>\
         <text class=\"axis\" x=\"{left}\" y=\"{:.1}\">{}</text>\
         <text class=\"axis\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">now (+{})</text></svg>",
        last.ready,
        last.desired,
        h - bottom,
        w - 10.0,
        h - bottom,
        path(&|p| p.desired),
        path(&|p| p.ready),
        left - 4.0,
        y(ymax as u32) + 4.0,
        ymax as u32,
        left - 4.0,
        h - bottom,
        h - 4.0,
        DateTime::from_timestamp(t0, 0).map(|t| t.format("%H:%M:%S").to_string()).unwrap_or_default(),
        w - 10.0,
        h - 4.0,
        seconds(chrono::Duration::seconds(t1 - t0)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timeline_draws_one_bar_per_started_step_and_names_states_in_text() -> anyhow::Result<()> {
        let now = DateTime::parse_from_rfc3339("2026-11-24T00:01:00Z")?.with_timezone(&Utc);
        let steps = vec![
            json!({"kind": "CreateServer", "target": "a", "state": "Done", "startedAt": "2026-11-24T00:00:00Z", "finishedAt": "2026-11-24T00:00:20Z"}),
            json!({"kind": "InstallTaskServ", "target": "etcd", "state": "Running", "startedAt": "2026-11-24T00:00:20Z"}),
            json!({"kind": "InstallTaskServ", "target": "web", "state": "Pending"}),
        ];
        let svg = steps_timeline(&steps, now);
        assert_eq!(svg.matches("<rect").count(), 2, "{svg}");
        assert!(
            svg.contains("✔ CreateServer a") && svg.contains("▶ InstallTaskServ etcd") && svg.contains("… InstallTaskServ web"),
            "{svg}"
        );
        // The running bar reaches the right edge (now).
        assert!(svg.contains("width=\"393.3\""), "{svg}");
        Ok(())
    }

    #[test]
    fn ready_chart_is_a_step_line_to_now() -> anyhow::Result<()> {
        let now = DateTime::parse_from_rfc3339("2026-11-24T00:01:40Z")?.with_timezone(&Utc);
        let t = now.timestamp();
        let pts = [ReadyPoint { at: t - 100, ready: 0, desired: 3 }, ReadyPoint { at: t - 50, ready: 3, desired: 3 }];
        let svg = ready_chart(&pts, now);
        assert!(svg.contains("now 3 of 3") && svg.contains(" H") && svg.contains("now (+100s)"), "{svg}");
        Ok(())
    }
}
