// harnessrl trace viewer: a hash-routed page over the JSON API in harnessrl/ui/app.py.
// Trace contents are untrusted text (model output, tool output): they only ever reach the
// page through textContent, never innerHTML.
"use strict";

const POLL_MS = 3000;
const $view = document.getElementById("view");
let pollTimer = null;
let renderSeq = 0;

// ------------------------------------------------------------------ helpers
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

async function api(path, params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") qs.set(k, v);
  }
  const resp = await fetch(`/api/${path}?${qs}`);
  if (!resp.ok) throw new Error(`${path}: ${resp.status} ${await resp.text()}`);
  return resp.json();
}

function link(route, params, ...kids) {
  return h("a", { href: href(route, params) }, ...kids);
}

function href(route, params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") qs.set(k, v);
  }
  const s = qs.toString();
  return `#/${route}${s ? "?" + s : ""}`;
}

const absent = () => h("span", { class: "muted", title: "not recorded" }, "—");
const fmt = (x, digits = 3) =>
  x === null || x === undefined ? absent() : Number.isInteger(x) ? String(x) : x.toFixed(digits);
const pct = (x) => (x === null || x === undefined ? absent() : `${(100 * x).toFixed(0)}%`);
const secs = (x) => (x === null || x === undefined ? absent() : `${x.toFixed(1)} s`);
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : absent());
const badge = (state) => h("span", { class: `badge s-${state}` }, state.replace("_", " "));

function crumbs(...items) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...items.map(([text, route, params]) =>
    route !== undefined ? link(route, params, text) : h("span", {}, text)));
}

function live(on) {
  document.getElementById("live").textContent = on ? "live · refreshes every 3 s" : "";
}

// A live page re-fetches its data part every POLL_MS while the tab is visible.
function poll(fn, seq) {
  clearInterval(pollTimer);
  live(true);
  pollTimer = setInterval(() => {
    if (seq !== renderSeq) clearInterval(pollTimer);
    else if (!document.hidden) fn().catch(showError);
  }, POLL_MS);
}

function showError(err) {
  $view.append(h("p", { class: "error" }, String(err)));
}

// ------------------------------------------------------------------ runs
function histogram(hist) {
  if (!hist) return absent();
  const W = 130, H = 34, n = hist.counts.length, max = Math.max(...hist.counts, 1);
  const bw = W / n, step = (hist.high - hist.low) / n;
  const bars = hist.counts.map((c, i) => {
    const bh = (c / max) * (H - 2);
    const lo = hist.low + i * step;
    return svg("rect", { x: i * bw + 1, y: H - bh, width: bw - 2, height: bh },
      svg("title", {}, `${lo.toFixed(3)} – ${(lo + step).toFixed(3)}: ${c}`));
  });
  return svg("svg", { class: "hist", width: W, height: H + 12, "data-counts": hist.counts.join(",") },
    ...bars,
    svg("text", { x: 0, y: H + 11 }, hist.low.toFixed(2)),
    svg("text", { x: W, y: H + 11, "text-anchor": "end" }, hist.high.toFixed(2)));
}

function runCard(run) {
  const rows = run.harnesses.map((s) => h("tr", {},
    h("td", {}, link("rollouts", { run: run.id, harness: s.harness }, s.harness),
      " ", h("span", { class: "muted" }, s.version || "")),
    h("td", { class: "num" }, s.outcomes), h("td", { class: "num" }, s.passed),
    h("td", { class: "num pass-rate" }, pct(s.pass_rate)),
    h("td", { class: "num" }, fmt(s.mean_reward)), h("td", {}, histogram(s.rewards)),
    h("td", { class: "num" }, fmt(s.tool_calls_per_solved, 1)),
    h("td", { class: "num" }, fmt(s.tokens_per_solved, 0)),
    h("td", { class: "num" }, s.infra_errors)));
  const models = run.models.length
    ? run.models.map((m) => `${m.model ?? "(none)"} (${m.turns} turns)`).join(", ") : absent();
  return h("div", { class: "card run", "data-run": run.id },
    h("h2", {}, link("rollouts", { run: run.id }, run.id === "." ? run.path : run.id)),
    h("dl", { class: "kv" },
      h("dt", {}, "path"), h("dd", { class: "mono" }, run.path),
      h("dt", {}, "model"), h("dd", {}, models),
      h("dt", {}, "harnesses"), h("dd", {}, run.harnesses.map((s) => s.harness).join(", ") || absent()),
      h("dt", {}, "tasks"), h("dd", {}, `${run.tasks}: ${run.task_names.join(", ")}`,
        run.tasks > run.task_names.length ? " …" : ""),
      h("dt", {}, "progress"), h("dd", { class: "progress" },
        `${run.outcomes} rollouts with an outcome, ${run.running} running, `,
        `${run.rollouts} started (retries included), ${run.turns} turns`)),
    h("h3", {}, "per harness"),
    h("table", {}, h("tr", {}, ...["harness", "outcomes", "passed", "pass rate", "mean reward",
      "reward distribution", "tool calls / solved", "tokens / solved", "infra errors"]
      .map((c) => h("th", {}, c))), ...rows),
    ...nodeTable(run.nodes || []));
}

// A --cluster ray run: rollouts per node, from the node each rollout record names.
function nodeTable(nodes) {
  if (!nodes.length) return [];
  const rows = nodes.map((n) => h("tr", { "data-node": n.node },
    h("td", { class: "mono" }, n.node.slice(0, 12)), h("td", { class: "num" }, n.outcomes),
    h("td", { class: "num" }, n.passed), h("td", { class: "num" }, n.infra_errors),
    h("td", { class: "num" }, n.reruns)));
  return [h("h3", {}, "per node"),
    h("table", { class: "nodes" }, h("tr", {}, ...["node", "outcomes", "passed", "infra errors",
      "reruns after a lost node"].map((c) => h("th", {}, c))), ...rows)];
}

// ------------------------------------------------------------------ per-step curves
const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

// One small line chart: `series` of {name, points: [[step, value], ...]}; `bands` of
// {name, points: [[step, value, low, high], ...]} draw their interval as a shaded area.
function lineChart(name, series, bands = []) {
  const W = 300, H = 120, L = 38, B = 16, T = 6;
  const all = [...series.flatMap((s) => s.points),
    ...bands.flatMap((b) => b.points.flatMap((p) => [[p[0], p[1]], [p[0], p[2] ?? p[1]], [p[0], p[3] ?? p[1]]]))];
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(...ys, 0), y1 = Math.max(...ys);
  if (y1 <= y0) y1 = y0 + 1;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - 4);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const kids = [
    svg("line", { x1: L, y1: H - B, x2: W - 4, y2: H - B, class: "axis" }),
    svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
    svg("text", { x: L - 3, y: T + 8, "text-anchor": "end" }, Number(y1.toPrecision(3))),
    svg("text", { x: L - 3, y: H - B, "text-anchor": "end" }, Number(y0.toPrecision(3))),
    svg("text", { x: L, y: H - 3 }, `step ${x0}`),
    svg("text", { x: W - 4, y: H - 3, "text-anchor": "end" }, `${x1}`)];
  const legend = [];
  const draw = (s, i, band) => {
    const colour = COLOURS[i % COLOURS.length];
    if (band) {
      const upper = s.points.map((p) => `${X(p[0])},${Y(p[3] ?? p[1])}`);
      const lower = s.points.slice().reverse().map((p) => `${X(p[0])},${Y(p[2] ?? p[1])}`);
      kids.push(svg("polygon", { points: [...upper, ...lower].join(" "), fill: colour,
        "fill-opacity": 0.15, class: "band", "data-series": s.name }));
    }
    kids.push(svg("polyline", { points: s.points.map((p) => `${X(p[0])},${Y(p[1])}`).join(" "),
      fill: "none", stroke: colour, "stroke-width": 1.5, class: "series", "data-series": s.name,
      "data-points": s.points.map((p) => `${p[0]}:${p[1]}`).join(",") }));
    for (const p of s.points) {
      kids.push(svg("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2, fill: colour },
        svg("title", {}, `${s.name} · step ${p[0]}: ${Number(p[1].toPrecision(4))}` +
          (band && p[2] !== null ? ` (${p[2].toFixed(2)}–${p[3].toFixed(2)})` : ""))));
    }
    legend.push(h("span", { class: "legend", style: `color:${colour}` }, s.name));
  };
  series.forEach((s, i) => draw(s, i, false));
  bands.forEach((b, i) => draw(b, series.length + i, true));
  return h("figure", { class: "chart", "data-chart": name },
    h("figcaption", {}, name, " ", ...legend),
    svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` }, ...kids));
}

function stepCharts(data) {
  if (!data || (!data.steps && !data.eval.length)) return [];
  const charts = data.charts.map((c) => lineChart(c.name, c.series));
  if (data.eval.length) {
    charts.splice(1, 0, lineChart("eval pass@1 (95% interval)", [],
      data.eval.map((e) => ({ name: e.harness, points: e.points }))));
  }
  return [h("h3", {}, `per step (${data.steps} steps)`), h("div", { class: "charts" }, ...charts)];
}

async function viewRuns() {
  crumbs(["runs"]);
  const body = h("div", {});
  const load = async () => {
    const data = await api("runs");
    const curves = await Promise.all(data.runs.map((r) => api("steps", { run: r.id })));
    body.replaceChildren(...(data.runs.length
      ? data.runs.map((r, i) => { const card = runCard(r); card.append(...stepCharts(curves[i])); return card; })
      : [h("p", { class: "muted" }, `no trace store (trace.db) under ${data.root} yet`)]));
  };
  await load();
  return { nodes: [h("h1", {}, "Runs"), body], load };
}

// ------------------------------------------------------------------ rollouts
function shaping(o) {
  if (!o || !o.shaping || !Object.keys(o.shaping).length) return "";
  return Object.entries(o.shaping).map(([k, v]) => `${k} ${v >= 0 ? "+" : ""}${v.toFixed(3)}`)
    .join(", ");
}

function duration(r) {
  if (r.outcome && r.outcome.timings && r.outcome.timings.total !== undefined)
    return secs(r.outcome.timings.total);
  return r.closed ? secs(r.closed - r.created) : absent();
}

function infra(r) {
  const bits = [];
  if (r.outcome && r.outcome.error) bits.push(r.outcome.error);
  if (r.failed_turns) bits.push(`${r.failed_turns} failed turn(s)`);
  return bits.length ? h("span", { class: "error" }, bits.join("; ")) : "";
}

function rolloutRow(run, r) {
  const o = r.outcome;
  return h("tr", { class: "click rollout-row", "data-key": r.key,
    onclick: () => { location.hash = href("rollout", { run, key: r.key }); } },
    h("td", {}, r.harness ?? absent()), h("td", {}, r.task ?? absent()),
    h("td", { class: "num" }, r.sample ?? absent(), r.attempt > 1 ? ` (try ${r.attempt})` : ""),
    h("td", {}, badge(r.state)),
    h("td", { class: "num reward" }, o ? fmt(o.reward) : absent()),
    h("td", { class: "mono" }, shaping(o)),
    h("td", { class: "num" }, r.turns),
    h("td", { class: "num" }, o ? o.tool_calls : absent()),
    h("td", { class: "num" }, o ? o.completion_tokens : absent()),
    h("td", { class: "num" }, duration(r)), h("td", {}, infra(r)));
}

// `values`: plain strings, or [value, label] pairs.
function select(name, values, current, onchange, blank = "all") {
  return h("select", { name, onchange },
    h("option", { value: "" }, blank),
    ...values.map((v) => {
      const [value, label] = Array.isArray(v) ? v : [v, v];
      return h("option", { value, selected: value === current }, label);
    }));
}

async function viewRollouts(p) {
  const run = p.run || ".", offset = Number(p.offset || 0), limit = 50;
  crumbs(["runs", ""], [run === "." ? "run" : run]);
  const go = (changes) => { location.hash = href("rollouts", { ...p, offset: 0, ...changes }); };
  const filters = h("div", { class: "filters" });
  const table = h("div", {});
  const pager = h("div", { class: "pager" });
  const load = async () => {
    const data = await api("rollouts", { run, offset, limit, harness: p.harness, task: p.task,
      state: p.state });
    const f = data.facets;
    if (!filters.childElementCount) {
      filters.append(
        h("label", {}, "harness "), select("harness", f.harnesses, p.harness, (e) => go({ harness: e.target.value })),
        h("label", {}, "task "), h("input", { name: "task", list: "tasks", value: p.task || "",
          placeholder: "any task", onchange: (e) => go({ task: e.target.value }) }),
        h("datalist", { id: "tasks" }, ...f.tasks.map((t) => h("option", { value: t }))),
        h("label", {}, "outcome "), select("state", f.states, p.state, (e) => go({ state: e.target.value })));
    }
    table.replaceChildren(h("table", { id: "rollouts" },
      h("tr", {}, ...["harness", "task", "sample", "outcome", "reward", "shaping", "turns",
        "tool calls", "tokens", "duration", "infra errors"].map((c) => h("th", {}, c))),
      ...data.rows.map((r) => rolloutRow(run, r))));
    const last = Math.min(offset + limit, data.total);
    pager.replaceChildren(
      offset > 0 ? link("rollouts", { ...p, offset: Math.max(0, offset - limit) }, "‹ previous") : "",
      h("span", { class: "muted" }, data.total ? `${offset + 1}–${last} of ${data.total}` : "no rollouts"),
      last < data.total ? link("rollouts", { ...p, offset: offset + limit }, "next ›") : "");
  };
  await load();
  return { nodes: [h("h1", {}, "Rollouts ", link("atlas", { run }, "drift atlas")), filters, table, pager], load };
}

// ------------------------------------------------------------------ one rollout
function part(p) {
  switch (p.type) {
    case "text": return h("div", { class: "part-text" }, p.text);
    case "reasoning": return h("details", { class: "reasoning" },
      h("summary", {}, p.redacted ? "reasoning (redacted)" : "reasoning"), h("div", { class: "part-text" }, p.text));
    case "tool_call": return h("div", { class: "call tool-call" },
      h("b", {}, `▸ ${p.name}`), h("span", { class: "muted" }, ` ${p.id}`), h("pre", {}, p.arguments));
    case "tool_result": return h("div", { class: "call tool-result" },
      h("span", { class: "muted" }, `result of ${p.call_id}${p.is_error ? " (error)" : ""}`),
      ...p.content.map((c) => (c.type === "text" ? h("pre", {}, c.text) : h("div", {}, `[image ${c.url.slice(0, 60)}]`))));
    case "image": return h("div", {}, `[image ${p.url.slice(0, 80)}]`);
    default: return h("pre", {}, JSON.stringify(p));
  }
}

function message(m) {
  const role = h("div", { class: "role" }, m.role + (m.name ? ` · ${m.name}` : ""));
  if (m.role === "system") {  // long and the same every turn: folded until asked for
    const size = m.parts.reduce((n, p) => n + (p.text ? p.text.length : 0), 0);
    return h("details", { class: "msg system" }, h("summary", { class: "role" }, `system · ${size} characters`),
      ...m.parts.map(part));
  }
  return h("div", { class: `msg ${m.role}` }, role, ...m.parts.map(part));
}

function rawBox(run, key, index, which) {
  const box = h("div", { class: `raw raw-${which}` });
  const btn = h("button", { class: `btn-raw-${which}`, onclick: async () => {
    if (box.childElementCount) { box.replaceChildren(); btn.classList.remove("on"); return; }
    const d = await api("turn", { run, key, index });
    const raw = d[`raw_${which}`];
    btn.classList.add("on");
    box.replaceChildren(h("div", { class: "muted" }, `raw ${which} · ${raw.kind} · ${raw.bytes} bytes`,
      raw.coding ? ` received in content coding ${raw.coding}, shown decoded` : "",
      raw.clipped ? " (clipped)" : ""), h("pre", {}, raw.text));
  } }, `raw ${which}`);
  return [btn, box];
}

function historyNote(how, from) {
  if (how === "diverges") return h("div", { class: "note history-note" },
    `this request's history differs from the previous turn's after its first ${from} messages: shown from there`);
  if (how === "absent") return h("div", { class: "note" }, "no canonical request recorded");
  return "";
}

// The client's own retry count (x-stainless-retry-count), and the turn it repeated.
function retryNote(t) {
  if (t.retry_count === null || t.retry_count === undefined || t.retry_count === 0) return "";
  const of = t.retry_of === null || t.retry_of === undefined ? "" : ` of turn ${t.retry_of}`;
  return h("span", { class: "note retry", title: "the client's retry count for this call" },
    `retry ${t.retry_count}${of}`);
}

function turnCard(run, key, t, mode) {
  const [reqBtn, reqBox] = rawBox(run, key, t.index, "request");
  const [respBtn, respBox] = rawBox(run, key, t.index, "response");
  const took = t.timings.done ? t.timings.done - t.timings.received : null;
  const head = h("div", { class: "turn-head" },
    h("b", {}, `turn ${t.index}`), h("span", { class: "muted" }, t.dialect), badge(t.status),
    h("span", {}, "prompt ", fmt(t.prompt_tokens), " · completion ", fmt(t.completion_tokens), " tokens"),
    h("span", {}, secs(took)),
    t.completion ? h("span", { class: "muted" }, `finish: ${t.completion.finish_reason}`) : "",
    t.flags.length ? h("span", { class: "note" }, `flags: ${t.flags.join(", ")}`) : "",
    retryNote(t),
    h("span", { class: "acts" },
      link("tokens", { run, key, index: t.index }, h("span", { class: "tokens-link" }, "tokens")),
      reqBtn, respBtn));
  let body;
  if (mode === "native") {
    body = [t.native.history === "absent" ? h("div", { class: "note" }, "request body is not JSON with a message list")
      : historyNote(t.native.history, t.native.shown_from),
    ...t.native.items.map((it) => h("pre", { class: "native-item" }, JSON.stringify(it, null, 2))),
    h("div", { class: "muted" }, "the reply as sent to the harness: open “raw response”")];
  } else {
    body = [historyNote(t.history, t.shown_from),
      t.history !== "extends" && t.tools.length ? h("div", { class: "muted" }, `tools offered: ${t.tools.join(", ")}`) : "",
      ...t.messages.map(message),
      t.completion ? message({ role: "assistant", parts: t.completion.parts }) : h("div", { class: "muted" }, "no completion recorded")];
  }
  return h("div", { class: `card turn ${t.status === "ok" ? "" : "failed"}`, "data-index": t.index },
    head, t.error ? h("div", { class: "error" }, t.error) : "", ...body, reqBox, respBox);
}

function outcomeCard(r) {
  const o = r.outcome;
  if (!o) return h("div", { class: "card" }, h("p", { class: "muted" },
    r.state === "running" ? "running: no outcome yet" : "no outcome recorded for this rollout (a retry may have replaced it)"));
  const terms = Object.entries(o.shaping || {});
  const breakdown = h("table", { class: "breakdown" },
    h("tr", {}, h("th", {}, "verifier reward"), ...terms.map(([k]) => h("th", {}, k)), h("th", {}, "reward")),
    h("tr", {}, h("td", { class: "num" }, fmt(o.verifier_reward)),
      ...terms.map(([, v]) => h("td", { class: "num" }, (v >= 0 ? "+" : "") + v.toFixed(4))),
      h("td", { class: "num reward" }, fmt(o.reward))));
  return h("div", { class: "card outcome" },
    h("dl", { class: "kv" },
      h("dt", {}, "status"), h("dd", {}, o.status, o.error ? h("span", { class: "error" }, ` — ${o.error}`) : ""),
      h("dt", {}, "agent"), h("dd", {}, `finished: ${o.agent_finished ?? "?"}, exit code ${o.agent_exit_code ?? "—"}`,
        o.agent_timed_out ? ", timed out" : "", o.agent_detail ? ` · ${o.agent_detail}` : ""),
      h("dt", {}, "counts"), h("dd", {}, `${o.turns} turns, ${o.tool_calls} tool calls, ${o.completion_tokens} completion tokens, attempt ${o.attempts}`),
      h("dt", {}, "timings"), h("dd", {}, Object.entries(o.timings || {}).map(([k, v]) => `${k} ${v.toFixed(2)} s`).join(" · ")),
      h("dt", {}, "verifier"), h("dd", {}, o.verifier_status ?? absent())),
    h("h3", {}, "reward breakdown"), breakdown,
    h("h3", {}, "verifier output"), o.verifier_output ? h("pre", { class: "verifier" }, o.verifier_output) : absent());
}

async function viewRollout(p) {
  const run = p.run || ".", key = p.key, mode = p.mode || "canonical";
  const r = await api("rollout", { run, key });
  crumbs(["runs", ""], [run === "." ? "run" : run, "rollouts", { run }], [`${r.harness ?? "?"} · ${r.task ?? "?"}`]);
  const turns = h("div", { id: "turns" });
  const more = h("div", {});
  let offset = 0, busy = false;
  const loadMore = async () => {
    if (busy) return;  // the button and the live refresh must not fetch the same page twice
    busy = true;
    try {
      const page = await api("turns", { run, key, offset, limit: 20 });
      turns.append(...page.rows.map((t) => turnCard(run, key, t, mode)));
      offset += page.rows.length;
      more.replaceChildren(offset < page.total
        ? h("button", { onclick: loadMore }, `more turns (${offset} of ${page.total} shown)`) : "");
    } finally { busy = false; }
  };
  await loadMore();
  // While the rollout runs, new turns are appended; once it ends, the page is drawn again.
  const load = r.state !== "running" ? null : async () => {
    const now = await api("rollout", { run, key });
    if (now.state !== "running") route();
    else if (now.turns > offset && !more.childElementCount) await loadMore();
  };
  const others = r.siblings.filter((s) => s.key !== key);
  const compare = others.length ? h("span", {}, "compare with ",
    select("compare", others.map((s) => [s.key, `${s.harness} · sample ${s.sample} · ${s.state}` +
      (s.outcome && s.outcome.reward !== null ? ` · reward ${s.outcome.reward.toFixed(3)}` : "")]), null, (e) => {
      if (e.target.value) location.hash = href("compare", { run, a: key, b: e.target.value });
    }, "another rollout of this task…")) : "";
  return { nodes: [
    h("h1", {}, `${r.harness ?? "?"} · ${r.task ?? "?"} · sample ${r.sample ?? "?"} `, badge(r.state)),
    h("div", { class: "muted mono" }, key, " · started ", when(r.created)),
    h("div", { class: "filters" }, compare),
    outcomeCard(r),
    h("h2", {}, "Conversation ",
      ...["canonical", "native"].map((m) => h("button", { class: m === mode ? "on" : "",
        onclick: () => { location.hash = href("rollout", { run, key, mode: m }); } }, m === "native" ? "harness dialect" : "canonical"))),
    turns, more], load };
}

// ------------------------------------------------------------------ tokens
function lpColour(lp) {
  const p = Math.exp(lp);  // red where the model was unsure, green where it was sure
  return `hsl(${Math.round(120 * p)}, 70%, ${88 - 10 * (1 - p)}%)`;
}

// `mark`: the position (within `ids`) where a broken chain's prompt diverged, or -1.
function tokenSpans(ids, texts, lps, masked, mark = -1) {
  return ids.map((id, i) => {
    const lp = lps ? lps[i] : null;
    const text = texts ? texts[i] : `‹${id}›`;
    const title = i === mark ? `id ${id} · the first token that differs from the chain this prompt left`
      : masked ? `id ${id} · inserted by the environment (masked, no logprob)`
      : lp === null || lp === undefined ? `id ${id} · no logprob recorded`
        : `id ${id} · logprob ${lp.toFixed(4)} · p ${Math.exp(lp).toFixed(3)}`;
    const kind = (masked ? `masked m${i % 2}` : lp === null || lp === undefined ? "nolp" : "") +
      (i === mark ? " diverge" : "");
    const attrs = { class: `tok ${kind}`,
      title, "data-id": id };
    if (!masked && lp !== null && lp !== undefined) {
      attrs["data-lp"] = lp;
      attrs.style = `background:${lpColour(lp)}`;
    }
    return h("span", attrs, text.replace(/\n/g, "↵\n"));
  });
}

function chainsDiagram(run, key, d) {
  const rows = d.chains.map((c, n) => {
    const s = c.start;
    const where = s.reason === "first" ? "" : ` — left the chain ending at turn ${s.against} at token ${s.diverged_at}` +
      ` (in the ${s.within} of turn ${s.within_turn})`;
    return h("div", { class: "row chain", "data-reason": s.reason },
      h("span", { class: "label", title: c.why }, `chain ${n + 1}: `, h("b", {}, s.reason.replace("_", " ")), where),
      ...c.turns.flatMap((t, i) => [i ? h("span", { class: "link-arrow" }, "→") : "",
        h("a", { class: `chip ${t === d.index ? "here" : ""}`, href: href("tokens", { run, key, index: t }) }, t)]),
      c.drift ? driftBox(c.drift) : "");
  });
  const excl = d.excluded.length ? [h("div", { class: "row" }, h("span", { class: "label" }, "in no chain:"),
    ...d.excluded.map((e) => h("a", { class: `chip excl ${e.turn === d.index ? "here" : ""}`, title: e.why,
      href: href("tokens", { run, key, index: e.turn }) }, `${e.turn}: ${e.reason}`)))] : [];
  return h("div", { class: "card chains" }, h("h3", {}, "chains across turns"),
    ...rows, ...excl, h("div", { class: "muted" }, "hover a reason for its meaning; a chain is one training sequence"));
}

// A break's cause and what lies on both sides of its first difference: the messages' own
// text, and the ids around it (decoded when the viewer has a tokenizer).
function driftBox(dr) {
  const ids = (pieces, list) => pieces ? pieces.join("") : list.map((i) => `‹${i}›`).join("");
  const side = (label, cls, text, pieces, list) => h("div", { class: `drift-side ${cls}` },
    h("span", { class: "muted" }, label), h("pre", { class: "drift-text" }, text || "—"),
    list.length ? h("pre", { class: "drift-ids", title: `ids from position ${dr.ids_start}` }, ids(pieces, list)) : "");
  return h("div", { class: "drift", "data-cause": dr.cause },
    h("div", {}, "cause: ", h("b", { class: "cause", title: dr.training }, dr.cause.replaceAll("_", " ")),
      h("span", { class: "muted" }, ` (${dr.where}) — ${dr.what}`), dr.detail ? h("span", { class: "drift-detail muted" }, ` · ${dr.detail}`) : ""),
    side("the chain had", "old", dr.old_text, dr.old_pieces, dr.old_ids || []),
    side("the new prompt has", "new", dr.new_text, dr.new_pieces, dr.new_ids || []));
}

// ------------------------------------------------------------------ atlas
function counts(obj) {
  return Object.entries(obj || {}).sort().map(([k, n]) => `${k.replaceAll("_", " ")} ${n}`).join(", ") || "—";
}

async function viewAtlas(p) {
  const run = p.run || ".";
  crumbs(["runs", ""], [run === "." ? "run" : run, "rollouts", { run }], ["drift atlas"]);
  const data = await api("atlas", { run });
  const pct = (x) => x === null || x === undefined ? "—" : `${Math.round(100 * x)}%`;
  const table = h("table", { id: "atlas" },
    h("tr", {}, ...["harness", "model family", "rollouts", "turns", "ext. rate", "rows / rollout",
      "breaks by cause", "calls by kind"].map((c) => h("th", {}, c))),
    ...data.rows.map((r) => h("tr", { class: "atlas-row", "data-harness": r.harness },
      h("td", {}, r.harness), h("td", {}, r.family), h("td", {}, r.rollouts), h("td", {}, r.turns),
      h("td", {}, pct(r.extension_rate)),
      h("td", {}, r.rows_per_rollout === null ? "—" : r.rows_per_rollout.toFixed(2)),
      h("td", {}, counts(r.causes)), h("td", {}, counts(r.kinds)))));
  const examples = data.rows.flatMap((r) => Object.entries(r.examples).sort().map(([cause, ex]) =>
    h("div", { class: "card example" }, h("h3", {}, `${r.harness} · `,
      link("tokens", { run, key: ex.rollout, index: ex.turn }, `turn ${ex.turn} of ${ex.rollout}`)),
      driftBox({ ...ex, what: "", training: "" }))));
  return { nodes: [h("h1", {}, "Drift atlas"), table, h("h2", {}, "one example per cause"), ...examples] };
}

async function viewTokens(p) {
  const run = p.run || ".", key = p.key, index = Number(p.index || 0);
  const [r, d] = await Promise.all([api("rollout", { run, key }),
    api("tokens", { run, key, index, ctx: p.ctx })]);
  crumbs(["runs", ""], [run === "." ? "run" : run, "rollouts", { run }],
    [`${r.harness ?? "?"} · ${r.task ?? "?"}`, "rollout", { run, key }], [`turn ${index} tokens`]);
  const c = d.completion, ctx = d.context;
  const nav = h("div", { class: "filters" },
    index > 0 ? link("tokens", { run, key, index: index - 1 }, "‹ turn " + (index - 1)) : "",
    index + 1 < r.turns ? link("tokens", { run, key, index: index + 1 }, "turn " + (index + 1) + " ›") : "",
    d.tokenizer ? h("span", { class: "muted", title: d.tokenizer },
      `text by tokenizer ${d.tokenizer.replace(/\/+$/, "").split("/").pop()}`) : "",
    d.tokenizer_problem ? h("span", { class: "note" }, d.tokenizer_problem) : "");
  const ctxTitle = ctx.kind === "inserted"
    ? `inserted by the environment after turn ${ctx.from_turn} (tool results, new user text, template): masked in training`
    : "prompt of the chain's first turn (not trained)";
  const end = ctx.offset + ctx.ids.length;
  const ctxPager = h("span", { class: "muted" }, ` — ${ctx.total} tokens`,
    ctx.total > ctx.ids.length ? `, showing ${ctx.offset}–${end}` : "", " ",
    ctx.offset > 0 ? link("tokens", { run, key, index, ctx: Math.max(0, ctx.offset - 2000) }, "earlier") : "", " ",
    end < ctx.total ? link("tokens", { run, key, index, ctx: end }, "later") : "");
  const mark = ctx.diverged_at === null ? -1 : ctx.diverged_at - ctx.offset;
  const ctxBox = h("div", { class: "toks ctx-tokens" }, ...tokenSpans(ctx.ids, ctx.text, null, true, mark));
  // Start scrolled to what matters: the divergence of a broken chain, else the prompt's end.
  const after = () => {
    const at = ctxBox.querySelector(".diverge");
    if (at) ctxBox.scrollTop = at.offsetTop - ctxBox.offsetTop - 40;
    else if (ctx.kind === "prompt") ctxBox.scrollTop = ctxBox.scrollHeight;
  };
  const legend = h("div", { class: "legend" }, "logprob:",
    ...[-4, -2, -1, -0.3, -0.05, 0].map((lp) => h("span", {}, h("span", { class: "sw", style: `background:${lpColour(lp)}` }), ` ${lp}`)),
    h("span", {}, h("span", { class: "sw", style: "background:#e6e6e6" }), " masked"));
  return { nodes: [
    h("h1", {}, `Turn ${index} tokens `, badge(d.status)), nav,
    d.flags.length ? h("div", { class: "note" }, `flags: ${d.flags.join(", ")}`) : "",
    chainsDiagram(run, key, d),
    h("div", { class: "card" }, h("h3", {}, ctxTitle, ctxPager),
      ctxBox),
    h("div", { class: "card" }, h("h3", {}, `completion — ${c.ids ? c.ids.length : 0} sampled tokens`,
      c.logprobs ? "" : " (no logprobs recorded)"), legend,
      c.ids ? h("div", { class: "toks completion-tokens" }, ...tokenSpans(c.ids, c.text, c.logprobs, false))
        : h("p", { class: "muted" }, "no completion ids recorded"))], after };
}

// ------------------------------------------------------------------ compare
async function compareColumn(run, key) {
  const [r, page] = await Promise.all([api("rollout", { run, key }), api("turns", { run, key, limit: 50 })]);
  const o = r.outcome;
  return h("div", { class: "compare-col", "data-key": key },
    h("h2", {}, link("rollout", { run, key }, `${r.harness} · sample ${r.sample}`), " ", badge(r.state)),
    h("dl", { class: "kv card" },
      h("dt", {}, "reward"), h("dd", { class: "reward" }, o ? fmt(o.reward) : absent()),
      h("dt", {}, "shaping"), h("dd", {}, shaping(o) || absent()),
      h("dt", {}, "turns"), h("dd", {}, r.turns), h("dt", {}, "tool calls"), h("dd", {}, o ? o.tool_calls : absent()),
      h("dt", {}, "tokens"), h("dd", {}, o ? o.completion_tokens : absent()),
      h("dt", {}, "duration"), h("dd", {}, duration(r))),
    ...page.rows.map((t) => turnCard(run, key, t, "canonical")),
    page.total > page.rows.length ? h("p", { class: "muted" }, `first ${page.rows.length} of ${page.total} turns`) : "");
}

async function viewCompare(p) {
  const run = p.run || ".";
  const cols = await Promise.all([compareColumn(run, p.a), compareColumn(run, p.b)]);
  crumbs(["runs", ""], [run === "." ? "run" : run, "rollouts", { run }], ["compare"]);
  return { nodes: [h("h1", {}, "Compare"), h("div", { class: "cols" }, ...cols)] };
}

// ------------------------------------------------------------------ router
const ROUTES = { "": viewRuns, rollouts: viewRollouts, rollout: viewRollout, tokens: viewTokens,
  compare: viewCompare, atlas: viewAtlas };

async function route() {
  clearInterval(pollTimer);
  live(false);
  const seq = ++renderSeq;
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const view = ROUTES[path] || viewRuns;
  try {
    const page = await view(Object.fromEntries(new URLSearchParams(query || "")));
    if (seq !== renderSeq) return;  // the user moved on while this page was loading
    $view.replaceChildren(...page.nodes);
    window.scrollTo(0, 0);
    if (page.after) page.after();
    if (page.load) poll(page.load, seq);
  } catch (err) {
    if (seq === renderSeq) $view.replaceChildren(h("p", { class: "error" }, String(err)));
  }
}

window.addEventListener("hashchange", route);
route();
