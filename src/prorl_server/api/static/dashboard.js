// The prorl-server dashboard: polls dashboard/data and draws it. Every string from the server is set as
// textContent (never as HTML): job ids, data sources and error messages come from users and task code.
"use strict";

const KEY_STORAGE = "prorl-api-key"; // sessionStorage: this tab only, never in a URL
const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const STAGES = ["init", "run", "eval"];

const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: "Bearer " + key } : {};
}

function showProblem(message) {
  const problem = $("problem");
  problem.textContent = message;
  problem.hidden = !message;
}

function fixed(value, digits) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function renderPipeline(status) {
  for (const stage of STAGES) {
    $(`stage-${stage}-queue`).textContent = status.queues[stage] ?? 0;
    $(`stage-${stage}-busy`).textContent = status.busy_workers[stage] ?? 0;
    $(`stage-${stage}-workers`).textContent = status.workers[stage] ?? 0;
  }
  const running = $("running");
  running.textContent = status.running ? "running" : "stopped";
  running.className = "pill " + (status.running ? "on" : "off");
  const problems = status.problems ?? [];
  $("health").hidden = problems.length === 0;
  $("health-problems").hidden = problems.length === 0;
  $("health-problems").textContent = problems.join("; ");
  $("results-held").textContent = status.jobs.stored_results ?? 0;
  $("calls-waiting").textContent = status.scheduling ? status.scheduling.waiting_calls : 0;
}

function renderFinished(finished) {
  const list = $("finished");
  list.replaceChildren();
  const statuses = Object.keys(finished).sort();
  if (!statuses.length) list.append(el("dt", "none yet"), el("dd", ""));
  for (const status of statuses) {
    const count = el("dd", finished[status]);
    count.id = `finished-${status}`;
    list.append(el("dt", status, `status-${status}`), count);
  }
}

function renderBackends(backends) {
  const body = $("backends").tBodies[0];
  body.replaceChildren();
  for (const b of backends) {
    const row = el("tr");
    row.dataset.address = b.address;
    row.append(
      el("td", b.address, "id"),
      el("td", b.healthy ? "healthy" : "unhealthy", b.healthy ? "good" : "bad"),
      el("td", b.circuit, b.circuit === "closed" ? "" : "bad"),
      el("td", b.calls_in_flight),
      el("td", b.jobs_pinned),
      el("td", fixed(b.tokens_per_s, 1)),
      el("td", b.last_error ?? "", "error"),
    );
    body.append(row);
  }
  if (!backends.length) {
    const row = el("tr");
    row.append(el("td", "no backend registered"));
    body.append(row);
  }
}

function percent(fraction) {
  return `${(100 * fraction).toFixed(0)}%`;
}

let previousActions = null; // {t, busy}: the last poll's busy core-seconds, for the utilisation between polls

function renderActions(actions, generatedAt) {
  $("actions-section").hidden = !actions;
  if (!actions) return;
  $("actions-busy").textContent = actions.busy_cores;
  $("actions-cores").textContent = actions.cores;
  $("actions-running").textContent = actions.running;
  $("actions-waiting").textContent = actions.waiting;
  $("actions-meter").value = actions.busy_cores / actions.cores;
  $("actions-utilisation").textContent = percent(actions.busy_cores / actions.cores);
  const elapsed = previousActions ? generatedAt - previousActions.t : 0;
  $("actions-recent").textContent =
    elapsed > 0 ? percent((actions.busy_core_seconds - previousActions.busy) / (elapsed * actions.cores)) : "–";
  previousActions = { t: generatedAt, busy: actions.busy_core_seconds };
  const body = $("action-kinds").tBodies[0];
  body.replaceChildren();
  for (const [kind, k] of Object.entries(actions.kinds)) {
    const row = el("tr");
    row.dataset.kind = kind;
    row.append(
      el("td", kind, "id"),
      el("td", k.granted),
      el("td", k.completed),
      el("td", k.refused, k.refused ? "bad" : ""),
      el("td", fixed(k.mean_act_s, 3)),
      el("td", fixed(k.mean_queue_s, 3)),
      el("td", fixed(k.mean_cores, 2)),
    );
    body.append(row);
  }
  if (!body.rows.length) {
    const row = el("tr");
    row.append(el("td", "no action yet"));
    body.append(row);
  }
}

function renderJobs(jobs) {
  const body = $("recent-jobs").tBodies[0];
  body.replaceChildren();
  for (const job of jobs) {
    const row = el("tr");
    row.dataset.jobId = job.job_id;
    row.append(
      el("td", job.job_id, "id"),
      el("td", job.status, `status-${job.status}`),
      el("td", job.data_source ?? ""),
      el("td", fixed(job.reward, 3)),
      el("td", job.tokens),
      el("td", job.turns),
      el("td", fixed(job.total_s, 2)),
      el("td", job.error ?? "", "error"),
    );
    body.append(row);
  }
}

// A bar chart: `bars` is [{label, value, title, className}], drawn in an SVG of its own.
// `lastLabelEnd`: the last bar's axis label ends at the bar (for a label that would overflow the edge).
function barChart(container, bars, { showValues = true, lastLabelEnd = false } = {}) {
  const width = 600, height = 200, left = 34, bottom = 28, top = 14;
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  const max = Math.max(1, ...bars.map((b) => b.value));
  const plotH = height - bottom - top;
  const step = (width - left) / Math.max(1, bars.length);
  svg.append(svgEl("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, class: "axis" }));
  svg.append(svgEl("text", { x: 2, y: top + 4 }, max));
  svg.append(svgEl("text", { x: 2, y: height - bottom }, 0));
  bars.forEach((bar, i) => {
    const h = bar.value > 0 ? Math.max(2, (bar.value / max) * plotH) : 0;
    const x = left + i * step;
    const rect = svgEl("rect", {
      x: x + step * 0.1, y: height - bottom - h, width: Math.max(1, step * 0.8), height: h,
      class: "bar " + (bar.className || ""), "data-count": bar.value, "data-label": bar.label,
    });
    rect.append(svgEl("title", {}, bar.title ?? `${bar.label}: ${bar.value}`));
    svg.append(rect);
    if (showValues && bar.value > 0) {
      svg.append(svgEl("text", { x: x + step / 2, y: height - bottom - h - 3, "text-anchor": "middle" }, bar.value));
    }
    if (bar.axisLabel) {
      const anchor = lastLabelEnd && i === bars.length - 1 ? "end" : "middle";
      svg.append(svgEl("text", { x: x + step / 2, y: height - bottom + 14, "text-anchor": anchor }, bar.axisLabel));
    }
  });
  container.replaceChildren(svg);
}

function compact(n) {
  return n >= 1024 ? `${n / 1024}k` : String(n);
}

function renderLengths(buckets) {
  let lower = 0;
  const bars = buckets.map((b, i) => {
    const label = b.le === null ? `>${compact(lower)}` : `≤${compact(b.le)}`;
    const title = b.le === null ? `more than ${lower} tokens: ${b.count}` : `${lower + (i ? 1 : 0)}–${b.le} tokens: ${b.count}`;
    if (b.le !== null) lower = b.le;
    return { label, axisLabel: label, value: b.count, title, className: b.le === null ? "tail" : "" };
  });
  barChart($("lengths"), bars);
}

function renderThroughput(points, bucketS) {
  $("bucket-s").textContent = bucketS;
  const now = points.length ? points[points.length - 1].t : 0;
  const bars = points.map((p) => ({
    label: String(p.t), value: p.jobs, title: `${new Date(p.t * 1000).toLocaleTimeString()}: ${p.jobs} jobs, ${p.tokens} tokens`,
    axisLabel: (now - p.t) % 120 === 0 ? (now === p.t ? "now" : `-${(now - p.t) / 60}m`) : "",
  }));
  barChart($("throughput"), bars, { showValues: false, lastLabelEnd: true });
  const lastMinute = points.slice(-Math.round(60 / bucketS));
  const jobs = lastMinute.reduce((sum, p) => sum + p.jobs, 0);
  const tokens = lastMinute.reduce((sum, p) => sum + p.tokens, 0);
  $("throughput-summary").textContent = `last minute: ${jobs} jobs ended, ${(tokens / 60).toFixed(1)} tokens/s generated`;
}

function render(data) {
  renderPipeline(data.status);
  renderFinished(data.finished);
  renderBackends(data.backends);
  renderActions(data.status.actions, data.generated_at);
  renderJobs(data.recent_jobs);
  renderLengths(data.lengths);
  renderThroughput(data.throughput, data.bucket_s);
  $("updated").textContent = "updated " + new Date(data.generated_at * 1000).toLocaleTimeString();
  document.body.dataset.loaded = "1";
}

let timer = null;

async function poll() {
  clearTimeout(timer);
  try {
    const response = await fetch("dashboard/data", { headers: authHeaders(), cache: "no-store" });
    if (response.status === 401) {
      $("key-form").hidden = false;
      showProblem(sessionStorage.getItem(KEY_STORAGE) ? "the API key was refused" : "API key needed");
    } else if (!response.ok) {
      showProblem(`dashboard/data answered ${response.status}`);
    } else {
      $("key-form").hidden = true;
      showProblem("");
      render(await response.json());
    }
  } catch (error) {
    showProblem("server unreachable (" + error.message + ")");
  }
  clearTimeout(timer); // one polling loop, also when a key was entered while a poll was under way
  timer = setTimeout(poll, POLL_MS);
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, $("key-input").value);
  $("key-input").value = "";
  poll();
});

poll();
