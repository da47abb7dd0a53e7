// fiberexec's dashboard: polls /api/state once a second and draws it. No framework, no build.
"use strict";
(() => {
  const TOKEN = new URLSearchParams(location.search).get("token") || "";
  const AUTH = { Authorization: "Bearer " + TOKEN };
  const POLL_MS = 1000;
  const WINDOW = 60;        // seconds of task stream drawn, at most...
  const WINDOW_MIN = 10;    // ...and at least
  const AXIS = 14;          // pixels under the stream's lanes, for its time labels
  const OVERLAP = 2;        // seconds: spans are asked for again, as one may be recorded late
  const MAX_KEPT = 20000;   // spans kept for the stream and the straggler medians
  const HISTORY = 120;      // refreshes kept for the rate plots
  const STRAGGLER = 3;      // running longer than this many times its function's median...
  const STRAGGLER_MIN = 1;  // ...and this many seconds
  const QUIET = 10;         // seconds without a word from a worker at work before it is
                            // marked (an idle one says less often: a quarter silence apart)

  const $ = (id) => document.getElementById(id);
  let spans = [];
  const spanKeys = new Set();
  let newestEnd = 0;
  const history = [];
  let failuresShown = "";

  // ------------------------------------------------------------------ formatting
  const seconds = (s) => (s == null ? "" : s < 10 ? s.toFixed(1) + " s" : s < 3600 ?
    Math.round(s) + " s" : (s / 3600).toFixed(1) + " h");
  const bytes = (b) => (b == null ? "" : b >= 1 << 30 ? (b / (1 << 30)).toFixed(1) + " GiB" :
    (b / (1 << 20)).toFixed(0) + " MiB");
  const percent = (p) => (p == null ? "" : p.toFixed(0) + "%");
  const rate = (r) => (r >= 100 ? Math.round(r).toString() : r.toFixed(1));
  // A function's colour comes from its name; red is kept for failed tasks.
  const PALETTE = ["#4e79a7", "#59a14f", "#b07aa1", "#f28e2b", "#76b7b2", "#9c755f", "#edc948",
    "#8cd17d", "#a0cbe8", "#d4a6c8", "#86bcb6", "#bab0ac"];
  const colours = new Map();
  function colour(name) {
    let found = colours.get(name);
    if (!found) {
      let h = 0;
      for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
      colours.set(name, (found = PALETTE[h % PALETTE.length]));
    }
    return found;
  }
  const FAILED = "#c0392b";

  // ------------------------------------------------------------------ data
  const GONE = new Set(["lost", "retired"]);
  const compareIds = new Intl.Collator("en", { numeric: true }).compare;  // w2 before w10
  const byLiveThenId = (a, b) =>
    GONE.has(a.state) - GONE.has(b.state) || compareIds(a.id, b.id);

  function objects(columns, rows) {  // rows (lists) as objects keyed by column name
    return rows.map((row) => {
      const found = {};
      for (let i = 0; i < columns.length; i++) found[columns[i]] = row[i];
      return found;
    });
  }

  // A span is known by (task, worker): its times are derived anew at each read (the
  // executor's clock against the wall clock) and may differ by microseconds.
  function keepSpans(fresh, now) {
    for (const s of fresh) {
      const key = s.task + "/" + s.worker;
      if (spanKeys.has(key)) continue;
      spanKeys.add(key);
      spans.push(s);
      if (s.ended > newestEnd) newestEnd = s.ended;
    }
    const horizon = now - WINDOW;
    if (spans.length > MAX_KEPT || (spans.length && spans[0].ended < horizon)) {
      spans = spans.filter((s) => s.ended >= horizon).slice(-MAX_KEPT);
      spanKeys.clear();
      for (const s of spans) spanKeys.add(s.task + "/" + s.worker);
    }
  }

  function medians() {  // by function, and of every task under "*" (no function's name)
    const by = new Map([["*", []]]);
    for (const s of spans) {
      if (!s.ok) continue;
      let list = by.get(s.function);
      if (!list) by.set(s.function, (list = []));
      list.push(s.ended - s.started);
      by.get("*").push(s.ended - s.started);
    }
    const found = new Map();
    for (const [name, list] of by) {
      if (list.length < 5) continue;
      list.sort((a, b) => a - b);
      found.set(name, list[list.length >> 1]);
    }
    return found;
  }

  // ------------------------------------------------------------------ summary and plots
  function renderSummary(st) {
    const set = (id, v) => { const el = $(id); if (el.textContent !== v) el.textContent = v; };
    set("s-workers", String(st.workers));
    set("s-starting", String(st.workers_starting));
    set("s-pending", String(st.tasks_pending));
    set("s-running", String(st.tasks_running));
    set("s-done", String(st.tasks_done));
    set("s-failed", String(st.tasks_failed));
    set("s-retried", String(st.tasks_retried));
    set("s-lost", String(st.workers_lost));
    const last = history.length > 1 ? history[history.length - 1].rate : 0;
    set("s-rate", rate(last));
  }

  function remember(now, st) {
    const prev = history[history.length - 1];
    const finished = st.tasks_done + st.tasks_failed;
    const point = { t: now, finished, failed: st.tasks_failed, rate: 0, failRate: 0 };
    if (prev && now > prev.t) {
      point.rate = Math.max(0, (finished - prev.finished) / (now - prev.t));
      point.failRate = Math.max(0, (st.tasks_failed - prev.failed) / (now - prev.t));
    }
    history.push(point);
    if (history.length > HISTORY) history.shift();
  }

  // Sizes are read before anything is written, while the layout is still clean: a read
  // after a write forces the browser to lay the page out again, inside the refresh.
  function measure() {
    const size = (id) => ({ el: $(id), w: $(id).clientWidth, h: $(id).clientHeight });
    const wrap = $("workers-wrap");
    const sample = pool.find((row) => !row.tr.hidden);
    if (sample && !rowHeight) rowHeight = sample.tr.getBoundingClientRect().height;
    return {
      throughput: size("throughput"), failures: size("failure-rate"), stream: size("stream"),
      table: { top: wrap.scrollTop, height: wrap.clientHeight },
    };
  }

  function sizeCanvas({ el, w, h }) {
    const ratio = window.devicePixelRatio || 1;
    const pw = Math.max(1, Math.round(w * ratio)), ph = Math.max(1, Math.round(h * ratio));
    if (el.width !== pw || el.height !== ph) { el.width = pw; el.height = ph; }
    const ctx = el.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    return ctx;
  }

  function plot(box, field, stroke) {
    const ctx = sizeCanvas(box), { w, h } = box;
    const points = history.slice(1);
    const top = Math.max(1, ...points.map((p) => p[field]));
    ctx.fillStyle = "#6b7280";
    ctx.font = "11px system-ui";
    ctx.fillText(rate(top) + "/s", 4, 12);
    if (points.length < 2) return;
    const t0 = points[0].t, span = Math.max(1, points[points.length - 1].t - t0);
    ctx.strokeStyle = stroke;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    points.forEach((p, i) => {
      const x = ((p.t - t0) / span) * (w - 2) + 1, y = h - 2 - (p[field] / top) * (h - 18);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }

  // The stream shows the last minute, or less while the run is younger (at least 10 s).
  function streamWindow(workers, now) {
    let first = now;
    for (const s of spans) if (s.started < first) first = s.started;
    for (const wk of workers) if (wk.task && wk.task.started < first) first = wk.task.started;
    return Math.min(WINDOW, Math.max(WINDOW_MIN, Math.ceil((now - first) / 5) * 5));
  }

  function drawStream(box, workers, now) {
    const ctx = sizeCanvas(box), { w, h } = box;
    const shown = streamWindow(workers, now);
    const lane = new Map(workers.map((wk, i) => [wk.id, i]));
    const laneH = (h - AXIS) / Math.max(1, workers.length);
    const barH = Math.max(1, laneH - (laneH > 3 ? 1 : 0));
    const x = (t) => ((t - (now - shown)) / shown) * w;
    const byFill = new Map();  // one fillStyle per colour, not per bar
    const add = (id, start, end, fill) => {
      const i = lane.get(id);
      if (i === undefined) return;
      let bars = byFill.get(fill);
      if (!bars) byFill.set(fill, (bars = []));
      const x0 = Math.max(0, x(start));
      bars.push(x0, i * laneH, Math.max(1, x(end) - x0));
    };
    const names = new Set();
    let failed = false;
    for (const s of spans) {
      if (s.ended < now - shown) continue;
      if (s.ok) names.add(s.function); else failed = true;
      add(s.worker, s.started, s.ended, s.ok ? colour(s.function) : FAILED);
    }
    for (const wk of workers) {
      if (!wk.task) continue;
      names.add(wk.task.function);
      add(wk.id, wk.task.started, now, colour(wk.task.function));
    }
    for (const [fill, bars] of byFill) {
      ctx.fillStyle = fill;
      for (let i = 0; i < bars.length; i += 3) ctx.fillRect(bars[i], bars[i + 1], bars[i + 2], barH);
    }
    ctx.fillStyle = "#6b7280";
    ctx.font = "11px system-ui";
    ctx.fillText(`-${shown} s`, 2, h - 3);
    ctx.fillText("now", w - 24, h - 3);
    $("stream-window").textContent = `last ${shown} s, one lane per worker`;
    renderLegend(names, failed);
  }

  function renderLegend(names, failed) {
    const sorted = [...names].sort().slice(0, 30);
    const entries = sorted.map((name) => [name, colour(name)]);
    if (failed) entries.push(["failed", FAILED]);
    const key = entries.map((e) => e.join(" ")).join("\n");
    const legend = $("legend");
    if (legend.dataset.key === key) return;
    legend.dataset.key = key;
    legend.replaceChildren(...entries.map(([name, fill]) => {
      const li = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.style.background = fill;
      li.append(swatch, name);
      return li;
    }));
  }

  // ------------------------------------------------------------------ workers table
  // Only the rows in view (and a few around) exist: a thousand workers cost what forty do.
  const COLUMNS = ["id", "host", "state", "task", "running", "done", "failed", "cpu", "rss", "heard"];
  const EXTRA_ROWS = 10;
  const pool = [];          // row elements, reused for whichever workers are in view
  let rowHeight = 0;        // measured from a drawn row
  let table = { workers: [], now: 0, late: new Set() };

  function makeRow() {
    const tr = document.createElement("tr");
    const cells = COLUMNS.map((name) => {
      const td = document.createElement("td");
      td.className = name;
      tr.append(td);
      return td;
    });
    const td = document.createElement("td");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = "stack";
    button.title = "dump the running task's Python stack";
    button.className = "stack";
    td.append(button);
    tr.append(td);
    const row = { tr, cells, button, values: [], worker: "" };
    button.addEventListener("click", () => dumpStack(row.worker));
    return row;
  }

  function setCell(row, i, text) {
    if (row.values[i] !== text) { row.values[i] = text; row.cells[i].textContent = text; }
  }

  function stragglers(workers, now) {
    const typical = medians();
    const late = new Set();
    for (const wk of workers) {
      const task = wk.task;
      if (!task) continue;
      // a function none of whose tasks has finished is judged by every task's median
      const running = now - task.started;
      const median = typical.get(task.function) ?? typical.get("*");
      if (running > STRAGGLER_MIN && median !== undefined && running > STRAGGLER * median) {
        late.add(wk.id);
      }
    }
    return late;
  }

  function renderWorkers(workers, now, view) {
    table = { workers, now, late: stragglers(workers, now) };
    paintRows(view);
    $("workers-note").textContent = `${workers.length} workers` +
      (table.late.size ? `, ${table.late.size} straggling` : "");
  }

  function paintRows(view) {
    const { workers, now, late } = table;
    const height = rowHeight || 25;
    const first = Math.max(0, Math.floor(view.top / height) - EXTRA_ROWS);
    const last = Math.min(workers.length, Math.ceil((view.top + view.height) / height) + EXTRA_ROWS);
    const tbody = $("workers").tBodies[0], below = $("below");
    $("above").firstChild.style.height = `${first * height}px`;
    below.firstChild.style.height = `${(workers.length - last) * height}px`;
    while (pool.length < last - first) {
      const row = makeRow();
      pool.push(row);
      tbody.insertBefore(row.tr, below);
    }
    pool.forEach((row, k) => {
      const wk = workers[first + k];
      row.tr.hidden = wk === undefined || first + k >= last;
      if (!row.tr.hidden) fillRow(row, wk, now, late.has(wk.id));
    });
  }

  function fillRow(row, wk, now, late) {
    const task = wk.task;
    const heard = wk.heard == null ? null : Math.max(0, now - wk.heard);
    const quiet = heard != null && heard > QUIET && wk.state === "running";
    const cls = `state-${wk.state}${late ? " straggler" : ""}${quiet ? " quiet" : ""}`;
    if (row.tr.className !== cls) row.tr.className = cls;
    if (row.worker !== wk.id) { row.worker = wk.id; row.tr.dataset.worker = wk.id; }
    row.cells[0].title = wk.reference;
    setCell(row, 0, wk.id);
    setCell(row, 1, wk.host);
    setCell(row, 2, wk.state);
    setCell(row, 3, task ? `${task.function}(${task.arguments})` : (wk.ended || ""));
    setCell(row, 4, task ? seconds(now - task.started) : "");
    setCell(row, 5, String(wk.done));
    setCell(row, 6, String(wk.failed));
    setCell(row, 7, percent(wk.cpu));
    setCell(row, 8, bytes(wk.rss));
    setCell(row, 9, heard == null ? "" : seconds(heard) + " ago");
    row.button.disabled = wk.state !== "running";
  }

  let scrollPending = false;
  function onScroll() {
    if (scrollPending) return;
    scrollPending = true;
    requestAnimationFrame(() => {
      scrollPending = false;
      const wrap = $("workers-wrap");
      paintRows({ top: wrap.scrollTop, height: wrap.clientHeight });
    });
  }

  async function dumpStack(id) {
    const panel = $("stack-panel"), pre = $("stack");
    panel.hidden = false;
    $("stack-title").textContent = `Stack of ${id}`;
    pre.textContent = "asking the worker...";
    try {
      const r = await fetch(`api/workers/${encodeURIComponent(id)}/stack`,
        { method: "POST", headers: AUTH, cache: "no-store" });
      pre.textContent = r.ok ? (await r.json()).stack : `${r.status}: ${await r.text()}`;
    } catch (err) {
      pre.textContent = `failed: ${err}`;
    }
  }

  // ------------------------------------------------------------------ failures
  function renderFailures(failures) {
    const key = failures.map((f) => f.task + "@" + f.when).join(",");
    if (key === failuresShown) return;
    failuresShown = key;
    $("no-failures").hidden = failures.length > 0;
    $("failures").replaceChildren(...failures.map((f, i) => {
      const details = document.createElement("details");
      details.className = "failure";
      details.open = i === 0;
      const summary = document.createElement("summary");
      const error = document.createElement("span");
      error.className = "error";
      error.textContent = f.error;
      summary.append(`${f.function}(${f.arguments}): `, error);
      const meta = document.createElement("div");
      meta.className = "meta";
      const when = new Date(f.when * 1000).toLocaleTimeString();  // drawn once: not "ago"
      meta.textContent = `task ${f.task} on ${f.worker ?? "no worker"}, at ${when}`;
      const pre = document.createElement("pre");
      pre.className = "traceback";
      pre.textContent = f.traceback;
      details.append(summary, meta, pre);
      return details;
    }));
  }

  // ------------------------------------------------------------------ the loop
  const timings = {};  // milliseconds each step of the last refresh took
  function timed(name, fn) {
    const t0 = performance.now();
    const value = fn();
    timings[name] = performance.now() - t0;
    return value;
  }

  async function refresh() {
    const since = Math.max(0, newestEnd - OVERLAP);
    const t0 = performance.now();
    const r = await fetch(`api/state?since=${since}`, { headers: AUTH, cache: "no-store" });
    if (!r.ok) throw new Error(`${r.status}: ${(await r.text()).trim()}`);
    const s = await r.json();
    s.workers = objects(s.columns.workers, s.workers);
    s.spans = objects(s.columns.spans, s.spans);
    for (const wk of s.workers) if (wk.task) wk.task = objects(s.columns.task, [wk.task])[0];
    s.workers.sort(byLiveThenId);  // rows and lanes keep their places between refreshes
    timings.fetch = performance.now() - t0;
    const view = timed("measure", measure);
    timed("spans", () => keepSpans(s.spans, s.now));
    remember(s.now, s.stats);
    renderSummary(s.stats);
    timed("workers", () => renderWorkers(s.workers, s.now, view.table));
    timed("stream", () => drawStream(view.stream, s.workers, s.now));
    timed("plots", () => {
      plot(view.throughput, "rate", "#3b6fd8");
      plot(view.failures, "failRate", "#c0392b");
    });
    timed("failures", () => renderFailures(s.failures));
    return s;
  }

  async function loop() {
    const status = $("status");
    const t0 = performance.now();
    try {
      const s = await refresh();
      const ms = performance.now() - t0;
      status.className = "";
      status.textContent = `updated ${new Date(s.now * 1000).toLocaleTimeString()} ` +
        `in ${ms.toFixed(0)} ms` + (s.spans_left_out ? ", older spans not drawn" : "");
    } catch (err) {
      status.className = "error";
      status.textContent = `not connected: ${err.message || err}`;
    }
    setTimeout(loop, POLL_MS);
  }

  // For tests and the curious: one full refresh, what its steps took, how many were made.
  window.fiberexecDashboard = { refresh, timings, refreshes: () => history.length };
  loop();
})();
