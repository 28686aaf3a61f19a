// The dashboard page: HTML, CSS and JS in one document, nothing loaded from
// elsewhere (the machines that run relay often have no network, and a report
// must open from a file years later). Charts are drawn as SVG by the script
// below; DOM text is always set with textContent, never parsed as HTML, so a
// sampled response cannot inject markup.
//
// What a test can read after rendering:
//   body[data-renders]          renders done (live mode: one per poll)
//   body[data-metrics]          metrics records the page holds
//   body[data-last-poll]        "ok" | "error" (live mode)
//   #page-errors[data-count]    window errors and unhandled rejections caught
//   .chart[data-chart][data-points][data-series]   one per chart drawn
//   #samples[data-tokens]       response tokens shown

#include "common/dashboard_page.h"

namespace relay {

const char kDashboardPage[] = R"page(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>relay: @TITLE@</title>
<style>
  :root { --fg: #1d232b; --muted: #66707c; --line: #dde2e8; --bg: #f6f7f9; --card: #fff; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
         color: var(--fg); background: var(--bg); }
  header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 4px 16px;
           padding: 12px 20px; background: var(--card); border-bottom: 1px solid var(--line); }
  header h1 { font-size: 18px; margin: 0; }
  #status { color: var(--muted); }
  #status.error { color: #b42318; }
  #summary { display: flex; flex-wrap: wrap; gap: 4px 18px; margin: 0; }
  #summary div { white-space: nowrap; }
  #summary dt { display: inline; color: var(--muted); }
  #summary dd { display: inline; margin: 0 0 0 4px; font-variant-numeric: tabular-nums; }
  main { padding: 12px 20px 40px; }
  h2 { font-size: 15px; margin: 18px 0 8px; }
  h3 { font-size: 13px; margin: 14px 0 6px; color: var(--muted); font-weight: 600; }
  #page-errors { margin: 0; padding: 8px 20px 8px 36px; background: #fee4e2; color: #7a271a;
                 font-family: ui-monospace, monospace; font-size: 12px; }
  #charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(430px, 1fr)); gap: 12px; }
  .chart { position: relative; background: var(--card); border: 1px solid var(--line);
           border-radius: 6px; padding: 8px 10px 6px; }
  .chart h2 { margin: 0 0 4px; font-size: 13px; }
  .chart svg { display: block; width: 100%; height: auto; }
  .chart .axis { font-size: 10px; fill: var(--muted); }
  .chart .grid { stroke: #eef1f4; }
  .chart .frame { stroke: var(--line); fill: none; }
  .legend { display: flex; flex-wrap: wrap; gap: 2px 12px; font-size: 12px; }
  .legend span.sw { display: inline-block; width: 10px; height: 3px; margin-right: 4px;
                    vertical-align: middle; }
  .legend .last { color: var(--muted); font-variant-numeric: tabular-nums; }
  .tip { position: absolute; pointer-events: none; background: rgba(29, 35, 43, .92); color: #fff;
         font-size: 11px; padding: 4px 6px; border-radius: 4px; white-space: pre; display: none; }
  .note { color: var(--muted); }
  table.samples { border-collapse: collapse; width: 100%; background: var(--card); }
  table.samples th, table.samples td { border: 1px solid var(--line); padding: 4px 6px;
                                       vertical-align: top; text-align: left; }
  table.samples th { font-weight: 600; color: var(--muted); font-size: 12px; }
  table.samples td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
  .text { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px;
          white-space: pre-wrap; word-break: break-all; }
  .prompt { color: var(--muted); }
  .tok { border-radius: 2px; padding: 0 1px; margin-right: 1px; }
  .tok.empty::after { content: "\2205"; color: var(--muted); }
  .tok.env { font-style: italic; color: var(--muted); outline: 1px dashed var(--muted); }
  .scale { display: inline-flex; align-items: center; gap: 6px; font-size: 12px; color: var(--muted); }
  .scale i { display: inline-block; width: 120px; height: 10px; border-radius: 2px;
             background: linear-gradient(90deg, hsl(0,75%,80%), hsl(60,75%,80%), hsl(120,75%,80%)); }
  details pre { background: var(--card); border: 1px solid var(--line); padding: 8px; overflow: auto; }
</style>
</head>
<body data-mode="@MODE@" data-renders="0">
<ul id="page-errors" data-count="0" hidden></ul>
<script>
  // Installed first, so that a failure anywhere later (a syntax error in the
  // main script included) shows on the page and is countable by a test.
  (function () {
    var count = 0;
    function report(message) {
      var box = document.getElementById('page-errors');
      var li = document.createElement('li');
      li.textContent = message;
      box.appendChild(li);
      box.hidden = false;
      box.setAttribute('data-count', String(++count));
    }
    window.addEventListener('error', function (e) {
      report('error: ' + e.message + ' (' + (e.filename || 'page') + ':' + (e.lineno || 0) + ')');
    });
    window.addEventListener('unhandledrejection', function (e) {
      var r = e.reason;
      report('unhandled rejection: ' + (r && r.stack ? r.stack : String(r)));
    });
  })();
</script>
<header>
  <h1>relay · @TITLE@</h1>
  <span id="status">loading</span>
  <dl id="summary"></dl>
</header>
<main>
  <section id="charts"></section>
  <h2>Latest sampled responses <span class="scale">token color: p = exp(log-prob), 0 <i></i> 1</span></h2>
  <div id="samples" data-tokens="0"><p class="note">loading</p></div>
  <details id="config-section"><summary>config.yaml</summary><pre id="config" class="text"></pre></details>
</main>
@RUN_DATA@
<script>
(function () {
  'use strict';
  const MODE = document.body.dataset.mode;
  const POLL_MS = 2000;
  const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#4b5563',
                  '#c026d3'];

  // Each chart is drawn only when at least one of its series has a point.
  // A series is {key, phase = 'rl', label = key}; `prefix` adds every rl key
  // that starts with it (minus `except`).
  const CHARTS = [
    {id: 'reward', title: 'Reward and held-out accuracy',
     series: [{key: 'reward/mean', label: 'reward (mean)'},
              {key: 'accuracy', phase: 'eval', label: 'held-out accuracy'}]},
    {id: 'kl', title: 'KL',
     series: [{key: 'kl_ref', label: 'KL to reference'},
              {key: 'ppo_kl', label: 'PPO KL (old → new policy)'},
              {key: 'reward_kl/kl', label: 'KL in reward'},
              {key: 'mismatch/k3', label: 'rollout vs trainer (k3)'}]},
    {id: 'clip', title: 'Clip fraction',
     series: [{key: 'clip_fraction', label: 'any'}, {key: 'clip_fraction/low', label: 'low'},
              {key: 'clip_fraction/high', label: 'high'}, {key: 'clip_fraction/dual', label: 'dual'}]},
    {id: 'ratio', title: 'Importance ratio',
     series: [{key: 'mean_importance_ratio', label: 'π / π_old (mean)'},
              {key: 'is_ratio/mean', label: 'π_old / π_behav mean'},
              {key: 'is_ratio/min', label: 'π_old / π_behav min'},
              {key: 'is_ratio/max', label: 'π_old / π_behav max'},
              {key: 'is_weight/mean', label: 'IS weight mean'},
              {key: 'is_weight/min', label: 'IS weight min'},
              {key: 'is_weight/max', label: 'IS weight max'},
              {key: 'proximal/behav_imp_weight', label: 'π_prox / π_behav'}]},
    {id: 'valid', title: 'frac_old_logprobs_valid',
     series: [{key: 'frac_old_logprobs_valid'},
              {key: 'proximal/recorded_fraction', label: 'proximal recorded'}]},
    {id: 'staleness', title: 'Staleness (versions)',
     series: [{key: 'staleness/mean', label: 'mean'}, {key: 'staleness/max', label: 'max'},
              {key: 'store/wait_versions_mean', label: 'versions waited in store'}]},
    {id: 'throughput', title: 'Throughput (samples/s)',
     series: [{key: 'throughput/samples_per_s', label: 'samples/s'}]},
    {id: 'time', title: 'Step time breakdown (s)',
     series: [{key: 'time/step_s', label: 'step'}, {key: 'store/wait_s', label: 'waiting for groups'},
              {key: 'weight_sync/broadcast_s', label: 'weight broadcast'},
              {prefix: 'time/', except: ['time/step_s', 'time/elapsed_s']}]},
    {id: 'loss', title: 'Loss',
     series: [{key: 'loss', label: 'loss'}, {key: 'pg_loss', label: 'policy-gradient loss'}]},
    {id: 'entropy', title: 'Entropy and response length',
     series: [{key: 'entropy', label: 'entropy'}, {key: 'response_length/mean', label: 'response length'}]},
    {id: 'sft', title: 'Warm start (SFT loss)',
     series: [{key: 'sft_loss', phase: 'sft', label: 'SFT loss'}]},
  ];

  const state = {run: '', metrics: [], samples: undefined, config: undefined, files: {},
                 renders: 0, samplesKey: null};

  function $(id) { return document.getElementById(id); }
  function h(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function s(tag, attrs, parent) {
    const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    const a = Math.abs(v);
    if (a === 0) return '0';
    if (a >= 1e5 || a < 1e-3) return v.toExponential(2);
    if (a >= 100) return v.toFixed(0);
    return String(+v.toPrecision(3));
  }

  // [[step, value], ...] of one metric, sorted by step; a step recorded twice
  // (a restarted trainer repeats the steps after its checkpoint) keeps the
  // later record.
  function points(phase, key) {
    const byStep = new Map();
    for (const r of state.metrics) {
      const v = r[key];
      if (r.phase === phase && typeof v === 'number' && isFinite(v)) byStep.set(r.step, v);
    }
    return Array.from(byStep.entries()).sort((a, b) => a[0] - b[0]);
  }

  function seriesOf(spec) {
    const out = [];
    const seen = new Set();
    const rlKeys = new Set();
    for (const r of state.metrics) if (r.phase === 'rl') for (const k in r) rlKeys.add(k);
    for (const def of spec.series) {
      const defs = def.prefix
          ? Array.from(rlKeys).filter(k => k.startsWith(def.prefix) && !def.except.includes(k))
                .sort().map(k => ({key: k}))
          : [def];
      for (const d of defs) {
        const phase = d.phase || 'rl';
        if (seen.has(phase + ' ' + d.key)) continue;
        seen.add(phase + ' ' + d.key);
        const pts = points(phase, d.key);
        if (pts.length) out.push({label: d.label || d.key, key: d.key, pts: pts});
      }
    }
    return out;
  }

  function ticks(lo, hi, n) {
    const raw = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(t => t >= raw) || raw;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
    return out;
  }

  function range(values) {
    let lo = Math.min(...values), hi = Math.max(...values);
    if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
    return [lo, hi];
  }

  function drawChart(spec, series) {
    const W = 440, H = 200, L = 48, R = 10, T = 8, B = 22;
    const box = h('div', {'class': 'chart', 'data-chart': spec.id});
    box.appendChild(h('h2', {}, spec.title));
    const svg = s('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': spec.title}, box);
    const all = series.flatMap(x => x.pts);
    const [x0, x1] = range(all.map(p => p[0]));
    let [y0, y1] = range(all.map(p => p[1]));
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const X = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    const Y = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const yt = ticks(y0, y1, 4);
    // As few decimals as keep the labels apart: 0.995 and 1.005 must not both read "1".
    let decimals = 0;
    while (decimals < 10 && new Set(yt.map(t => t.toFixed(decimals))).size < yt.length) ++decimals;
    const gap = yt.length > 1 ? yt[1] - yt[0] : 1;
    const label = t => (Math.abs(t) >= 1e5 || (gap < 1e-4 && t !== 0)) ? t.toExponential(2)
                                                                       : t.toFixed(decimals);
    for (const t of yt) {
      s('line', {'class': 'grid', x1: L, x2: W - R, y1: Y(t), y2: Y(t)}, svg);
      s('text', {'class': 'axis', x: L - 4, y: Y(t) + 3, 'text-anchor': 'end'}, svg).textContent = label(t);
    }
    for (const t of ticks(x0, x1, 5).filter(t => Number.isInteger(t))) {
      s('text', {'class': 'axis', x: X(t), y: H - 6, 'text-anchor': 'middle'}, svg).textContent = String(t);
    }
    s('rect', {'class': 'frame', x: L, y: T, width: W - L - R, height: H - T - B}, svg);
    const legend = h('div', {'class': 'legend'});
    series.forEach((x, i) => {
      const color = COLORS[i % COLORS.length];
      if (x.pts.length === 1) {
        s('circle', {cx: X(x.pts[0][0]), cy: Y(x.pts[0][1]), r: 3, fill: color}, svg);
      } else {
        s('polyline', {fill: 'none', stroke: color, 'stroke-width': 1.5, 'stroke-linejoin': 'round',
                       points: x.pts.map(p => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' ')}, svg);
      }
      const item = h('span', {title: x.key});
      item.appendChild(h('span', {'class': 'sw', style: 'background:' + color}));
      item.appendChild(document.createTextNode(x.label + ' '));
      item.appendChild(h('span', {'class': 'last'}, fmt(x.pts[x.pts.length - 1][1])));
      legend.appendChild(item);
    });
    box.appendChild(legend);
    // Hover: a cursor at the nearest recorded step and every series' value there.
    const cursor = s('line', {x1: 0, x2: 0, y1: T, y2: H - B, stroke: '#9aa4b0', visibility: 'hidden'}, svg);
    const tip = h('div', {'class': 'tip'});
    box.appendChild(tip);
    const steps = Array.from(new Set(all.map(p => p[0]))).sort((a, b) => a - b);
    svg.addEventListener('mousemove', ev => {
      const rect = svg.getBoundingClientRect();
      const sx = (ev.clientX - rect.left) / rect.width * W;
      const want = x0 + (sx - L) / (W - L - R) * (x1 - x0);
      let best = steps[0];
      for (const st of steps) if (Math.abs(st - want) < Math.abs(best - want)) best = st;
      cursor.setAttribute('x1', X(best)); cursor.setAttribute('x2', X(best));
      cursor.setAttribute('visibility', 'visible');
      const lines = ['step ' + best];
      for (const x of series) {
        const p = x.pts.find(q => q[0] === best);
        if (p) lines.push(x.label + ': ' + fmt(p[1]));
      }
      tip.textContent = lines.join('\n');
      tip.style.display = 'block';
      tip.style.left = Math.min(ev.clientX - box.getBoundingClientRect().left + 12, box.clientWidth - tip.offsetWidth - 4) + 'px';
      tip.style.top = (ev.clientY - box.getBoundingClientRect().top + 12) + 'px';
    });
    svg.addEventListener('mouseleave', () => { tip.style.display = 'none'; cursor.setAttribute('visibility', 'hidden'); });
    box.setAttribute('data-series', String(series.length));
    box.setAttribute('data-points', String(all.length));
    return box;
  }

  function renderCharts() {
    const charts = $('charts');
    charts.textContent = '';
    for (const spec of CHARTS) {
      const series = seriesOf(spec);
      if (series.length) charts.appendChild(drawChart(spec, series));
    }
    if (!charts.children.length) charts.appendChild(h('p', {'class': 'note'}, 'No metrics recorded yet.'));
  }

  function renderSummary() {
    const dl = $('summary');
    dl.textContent = '';
    const last = (phase, key) => { const p = points(phase, key); return p.length ? p[p.length - 1] : null; };
    const step = last('rl', 'reward/mean');
    const items = [
      ['RL step', step ? String(step[0]) : '–'],
      ['version', last('rl', 'version') ? String(last('rl', 'version')[1]) : '–'],
      ['reward', step ? fmt(step[1]) : '–'],
      ['accuracy', last('eval', 'accuracy') ? fmt(last('eval', 'accuracy')[1]) : '–'],
      ['samples/s', last('rl', 'throughput/samples_per_s') ? fmt(last('rl', 'throughput/samples_per_s')[1]) : '–'],
      ['elapsed', last('rl', 'time/elapsed_s') ? fmt(last('rl', 'time/elapsed_s')[1]) + ' s' : '–'],
    ];
    for (const [k, v] of items) {
      const d = h('div');
      d.appendChild(h('dt', {}, k));
      d.appendChild(h('dd', {}, v));
      dl.appendChild(d);
    }
  }

  // Background of a token: red at p = 0 through yellow to green at p = 1.
  function tokenColor(lp) {
    if (typeof lp !== 'number' || !isFinite(lp)) return '#e5e7eb';
    return `hsl(${Math.round(120 * Math.min(1, Math.exp(lp)))}, 75%, 80%)`;
  }

  function renderSamples() {
    const key = JSON.stringify(state.samples === undefined ? null : state.samples);
    if (key === state.samplesKey) return;  // unchanged: keep the DOM (and a hover) as it is
    state.samplesKey = key;
    const box = $('samples');
    box.textContent = '';
    let tokens = 0;
    if (state.samples === null) {
      box.appendChild(h('p', {'class': 'note'},
          'No samples.jsonl in this run directory (relay-trainer writes one line per RL step).'));
    } else if (!state.samples.length) {
      box.appendChild(h('p', {'class': 'note'}, 'No RL step has finished yet.'));
    }
    for (const line of (state.samples || []).slice().reverse()) {
      box.appendChild(h('h3', {}, `step ${line.step} · version ${line.version}`));
      const table = h('table', {'class': 'samples'});
      const head = h('tr');
      for (const c of ['reward', 'finish', 'sampled by', 'prompt → response (hover a token for its log-prob)']) {
        head.appendChild(h('th', {}, c));
      }
      table.appendChild(head);
      for (const smp of line.samples) {
        const tr = h('tr');
        tr.appendChild(h('td', {'class': 'num'}, fmt(smp.reward)));
        tr.appendChild(h('td', {}, smp.finish_reason || ''));
        const vs = (smp.versions || []).filter(v => typeof v === 'number');
        tr.appendChild(h('td', {'class': 'num'}, vs.length ? (Math.min(...vs) === Math.max(...vs)
            ? 'v' + vs[0] : `v${Math.min(...vs)}–v${Math.max(...vs)}`) : '–'));
        const td = h('td', {'class': 'text'});
        td.appendChild(h('span', {'class': 'prompt'}, smp.prompt || ''));
        td.appendChild(document.createTextNode(' → '));
        smp.pieces.forEach((piece, i) => {
          const lp = smp.logprobs[i];
          const ok = typeof lp === 'number';
          // An episode's environment tokens: context the model read, not sampled.
          const env = !!(smp.env_mask && smp.env_mask[i]);
          const t = h('span', {'class': (piece === '' ? 'tok empty' : 'tok') + (env ? ' env' : ''),
                               'data-logprob': ok ? String(lp) : 'null',
                               title: (env ? 'environment (not sampled; out of the loss)'
                                           : ok ? `log p ${lp.toFixed(4)}  (p ${Math.exp(lp).toFixed(3)})` : 'log p unknown') +
                                      (smp.token_ids ? `  id ${smp.token_ids[i]}` : '') +
                                      (smp.versions ? `  v${smp.versions[i]}` : '')}, piece);
          if (!env) t.style.background = tokenColor(lp);
          td.appendChild(t);
          ++tokens;
        });
        tr.appendChild(td);
        table.appendChild(tr);
      }
      box.appendChild(table);
    }
    box.setAttribute('data-tokens', String(tokens));
  }

  function render() {
    renderSummary();
    renderCharts();
    renderSamples();
    $('config').textContent = state.config === null ? '(no config.yaml in this run directory)' : state.config;
    document.body.setAttribute('data-metrics', String(state.metrics.length));
    document.body.setAttribute('data-renders', String(++state.renders));
  }

  function apply(data) {
    // A live page asks only for the records it lacks; metrics_from 0 is a full set
    // (the first answer, or the file was replaced).
    state.metrics = data.metrics_from === 0 ? data.metrics : state.metrics.concat(data.metrics);
    state.samples = data.samples;
    state.config = data.config;
    state.files = data.files || {};
  }

  function setStatus(text, error) {
    const st = $('status');
    st.textContent = text;
    st.className = error ? 'error' : '';
  }

  async function poll() {
    let data;
    try {
      const res = await fetch('api/run?metrics_from=' + state.metrics.length, {cache: 'no-store'});
      if (!res.ok) throw new Error(`api/run: HTTP ${res.status}: ${await res.text()}`);
      data = await res.json();
    } catch (e) {
      // The trainer may have finished or be restarting: say so and keep trying.
      setStatus(`live · no update since ${state.updated || 'start'}: ${e.message}`, true);
      document.body.setAttribute('data-last-poll', 'error');
      setTimeout(poll, POLL_MS);
      return;
    }
    setTimeout(poll, POLL_MS);
    apply(data);
    render();  // outside the try: a drawing bug must reach the error list, not the status line
    state.updated = new Date().toLocaleTimeString();
    setStatus(`live · updated ${state.updated} · every ${POLL_MS / 1000} s`, false);
    document.body.setAttribute('data-last-poll', 'ok');
  }

  if (MODE === 'report') {
    apply(JSON.parse($('run-data').textContent));
    render();
    setStatus('report of ' + (state.files.metrics || 'metrics.jsonl'), false);
  } else {
    poll();
  }
})();
</script>
</body>
</html>
)page";

}  // namespace relay
