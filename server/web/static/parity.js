// Parity's pages: follow a running comparison, draw the error chart and an API's history. Plain JS, no build.
"use strict";

(function () {
  function followJob() {
    const job = document.getElementById("job");
    if (!job || !["queued", "running"].includes(job.dataset.status)) return;
    const url = job.dataset.statusUrl;
    const tick = async function () {
      try {
        const resp = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
        if (resp.ok) {
          const s = await resp.json();
          const bar = document.getElementById("job-progress");
          const pct = document.getElementById("job-percent");
          const label = document.getElementById("job-status");
          if (bar) bar.value = s.progress;
          if (pct) pct.textContent = Math.round(s.progress * 100) + "%";
          if (label) { label.textContent = s.status; label.className = "st st-" + s.status; }
          const list = document.getElementById("rank-progress");
          if (list) {
            list.replaceChildren(...Object.entries(s.rank_progress || {}).map(function ([rank, p]) {
              const li = document.createElement("li");
              const bar2 = document.createElement("progress");
              bar2.max = 1; bar2.value = p;
              li.append("rank " + rank + ": ", bar2);
              return li;
            }));
          }
          if (s.status === "succeeded" || s.status === "failed") { window.location.reload(); return; }
        }
      } catch (e) { /* the server restarting: try again on the next tick */ }
      setTimeout(tick, 1000);
    };
    setTimeout(tick, 1000);
  }

  function setupCanvas(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.width;
    const height = canvas.clientHeight || canvas.height;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    return { ctx: ctx, width: width, height: height };
  }

  function logRange(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) {
      if (v !== null && v > 0) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    }
    if (!isFinite(lo)) { lo = 1e-8; hi = 1; }
    lo = Math.pow(10, Math.floor(Math.log10(Math.max(lo, 1e-16))));
    hi = Math.pow(10, Math.ceil(Math.log10(hi) + 1e-9));
    if (hi <= lo) hi = lo * 10;
    return [lo, hi];
  }

  function axes(ctx, box, lo, hi, label) {
    ctx.strokeStyle = "#d9dee7"; ctx.fillStyle = "#667085"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
    for (let e = Math.log10(lo); e <= Math.log10(hi) + 1e-9; e++) {
      const y = box.y(Math.pow(10, e));
      ctx.beginPath(); ctx.moveTo(box.left, y); ctx.lineTo(box.right, y); ctx.stroke();
      ctx.fillText("1e" + e, 4, y + 4);
    }
    ctx.fillText(label, box.left, box.bottom + 16);
  }

  async function drawChart() {
    const canvas = document.getElementById("chart");
    if (!canvas) return;
    const resp = await fetch(canvas.dataset.callsUrl, { credentials: "same-origin" });
    if (!resp.ok) return;
    const d = await resp.json();
    const n = d.api.length;
    const total = d.total || n;
    const { ctx, width, height } = setupCanvas(canvas);
    const [lo, hi] = logRange(d.rel.concat(d.cos));
    // The log scale stops at its floor; an error of exactly zero is drawn in a row of its own below it.
    const box = { left: 48, right: width - 10, top: 10, bottom: height - 44, zero: height - 30 };
    // x is the call's place in execution order; with a decimated series the kept calls keep their place.
    box.x = function (i) {
      const seq = d.seq ? d.seq[i] : i;
      return box.left + (total > 1 ? seq / (total - 1) : 0.5) * (box.right - box.left);
    };
    box.y = function (v) {
      if (v <= 0) return box.zero;
      const t = (Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo));
      return box.bottom - t * (box.bottom - box.top);
    };
    axes(ctx, box, lo, hi, "execution order (" + total + " calls) →");
    ctx.setLineDash([2, 3]); ctx.strokeStyle = "#b8c0cc";
    ctx.beginPath(); ctx.moveTo(box.left, box.zero); ctx.lineTo(box.right, box.zero); ctx.stroke();
    ctx.setLineDash([]); ctx.fillStyle = "#667085"; ctx.fillText("0", 4, box.zero + 4);
    let drawn = 0, zeros = 0;
    let divergence = -1;
    for (let i = 0; i < n; i++) {
      if (d.api[i] === d.first_divergence) divergence = i;
      const colour = d.backward[i] ? "#e07b00" : "#2457c5";
      const failing = d.status[i] === "fail" || d.status[i] === "unmatched";
      if (d.rel[i] !== null) {
        ctx.fillStyle = colour;
        ctx.beginPath(); ctx.arc(box.x(i), box.y(d.rel[i]), failing ? 3.2 : 2, 0, 2 * Math.PI); ctx.fill();
        drawn++;
        if (d.rel[i] <= 0) zeros++;
      }
      if (d.cos[i] !== null && d.cos[i] > 0) {
        ctx.strokeStyle = colour;
        ctx.beginPath(); ctx.arc(box.x(i), box.y(d.cos[i]), 3, 0, 2 * Math.PI); ctx.stroke();
        drawn++;
      }
    }
    // Labels go in the first row under the top where they overlap no label already placed.
    const placed = [];
    function label(text, x, colour, font) {
      ctx.font = font; ctx.fillStyle = colour;
      const w = ctx.measureText(text).width;
      const left = Math.max(box.left, Math.min(x + 6, box.right - w));
      let row = 0;
      while (row < 12 && placed.some(function (r) {
        return r.row === row && left < r.right + 6 && r.left < left + w + 6;
      })) row++;
      const y = box.top + 12 + 14 * row;
      ctx.fillText(text, left, y);
      placed.push({ row: row, left: left, right: left + w, top: y - 11, bottom: y + 3 });
    }
    if (divergence >= 0) {
      const x = box.x(divergence);
      ctx.strokeStyle = "#d00000"; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(x, box.top); ctx.lineTo(x, box.bottom); ctx.stroke();
      label("first divergence: " + d.first_divergence, x, "#d00000", "12px sans-serif");
    }
    // The calls new or worse since the previous comparison against the baseline: a triangle and a line each.
    const marks = d.marks || {};
    const marked = [];
    for (let i = 0; i < n; i++) {
      const verdict = marks[d.api[i]];
      if (!verdict) continue;
      const x = box.x(i);
      ctx.strokeStyle = "#7a1fa2"; ctx.fillStyle = "#7a1fa2"; ctx.lineWidth = 1; ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(x, box.top); ctx.lineTo(x, box.bottom); ctx.stroke();
      ctx.setLineDash([]);
      ctx.beginPath(); ctx.moveTo(x - 6, box.top); ctx.lineTo(x + 6, box.top); ctx.lineTo(x, box.top + 9);
      ctx.closePath(); ctx.fill();
      if (marked.length < 3) label(verdict + ": " + d.api[i], x + 2, "#7a1fa2", "11px sans-serif");
      marked.push(d.api[i]);
    }
    canvas.dataset.labels = JSON.stringify(placed);
    canvas.dataset.zeros = String(zeros);
    canvas.dataset.marked = JSON.stringify(marked);
    canvas.dataset.points = String(drawn);
    canvas.dataset.divergence = String(divergence);
    canvas.dataset.drawn = "1";
    const info = document.getElementById("chart-info");
    // The name of the call under the pointer, beside it (and in the line under the chart).
    const tip = document.createElement("div");
    tip.id = "chart-tip"; tip.className = "chart-tip"; tip.hidden = true;
    canvas.parentNode.style.position = "relative";
    canvas.parentNode.appendChild(tip);
    function nearest(event) {
      const rect = canvas.getBoundingClientRect();
      const px = event.clientX - rect.left;
      let best = -1, bestDistance = Infinity;
      for (let i = 0; i < n; i++) {  // a few thousand points at most: a scan is instant
        const distance = Math.abs(box.x(i) - px);
        if (distance < bestDistance) { best = i; bestDistance = distance; }
      }
      return best;
    }
    canvas.addEventListener("mousemove", function (event) {
      const i = nearest(event);
      if (i < 0) return;
      const text = d.api[i] + " · " + d.status[i] + " · MaxRelativeErr " +
        (d.rel[i] === null ? "n/a" : d.rel[i].toPrecision(3)) + " · 1 − cosine " +
        (d.cos[i] === null ? "n/a" : d.cos[i].toPrecision(3)) +
        (d.row && d.row[i] !== null && d.row[i] !== undefined ? " · Excel row " + (d.row[i] + 2) : "");
      if (info) info.textContent = text;
      tip.textContent = d.api[i];
      tip.hidden = false;
      const x = box.x(i), y = d.rel[i] !== null ? box.y(d.rel[i]) : box.bottom;
      tip.style.left = Math.min(canvas.offsetLeft + x + 8, canvas.offsetLeft + width - 220) + "px";
      tip.style.top = Math.max(canvas.offsetTop + y - 28, canvas.offsetTop) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
    canvas.addEventListener("click", function (event) {
      const i = nearest(event);
      if (i < 0) return;
      const target = new URL(canvas.dataset.rowsUrl, window.location.href);
      target.searchParams.set("name", d.api[i]);
      target.hash = "table";
      window.location.assign(target.toString());
    });
    canvas.chartApi = d.api;  // the browser tests click a given call through this
    canvas.chartX = function (i) { return box.x(i); };
  }

  // One line per step and mode, against time: a step's error and another step's are different measures.
  const SERIES_COLOURS = ["#2457c5", "#e07b00", "#1f8a4c", "#7a1fa2", "#b3141b", "#5b6b82"];

  function drawHistory() {
    const canvas = document.getElementById("history-chart");
    if (!canvas) return;
    const lines = JSON.parse(canvas.dataset.lines || "{}");
    const names = Object.keys(lines);
    const values = [];
    let t0 = Infinity, t1 = -Infinity;
    for (const name of names) {
      for (const [t, v] of lines[name]) { values.push(v); t0 = Math.min(t0, t); t1 = Math.max(t1, t); }
    }
    const { ctx, width, height } = setupCanvas(canvas);
    const [lo, hi] = logRange(values);
    const box = { left: 48, right: width - 10, top: 10, bottom: height - 24 };
    box.x = function (t) { return box.left + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (box.right - box.left); };
    box.y = function (v) {
      const t = (Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo));
      return box.bottom - t * (box.bottom - box.top);
    };
    const day = function (t) { return isFinite(t) ? new Date(t).toISOString().slice(0, 16).replace("T", " ") : ""; };
    axes(ctx, box, lo, hi, "time (UTC) →  " + day(t0) + (t1 > t0 ? " … " + day(t1) : ""));
    names.forEach(function (name, k) {
      const colour = SERIES_COLOURS[k % SERIES_COLOURS.length];
      ctx.strokeStyle = colour; ctx.fillStyle = colour; ctx.lineWidth = 1.5;
      ctx.beginPath();
      let started = false;
      for (const [t, v] of lines[name]) {
        if (v === null) continue;
        if (started) ctx.lineTo(box.x(t), box.y(v)); else { ctx.moveTo(box.x(t), box.y(v)); started = true; }
      }
      ctx.stroke();
      for (const [t, v] of lines[name]) {
        if (v !== null) { ctx.beginPath(); ctx.arc(box.x(t), box.y(v), 3, 0, 2 * Math.PI); ctx.fill(); }
      }
      ctx.font = "12px sans-serif";
      ctx.fillText(name, box.right - 160, box.top + 14 + 14 * k);
    });
    canvas.dataset.lines = String(names.length);
    canvas.dataset.drawn = "1";
  }

  function autoSubmit() {
    const box = document.getElementById("diff-only");
    if (box) box.addEventListener("change", function () { box.form.submit(); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    followJob();
    autoSubmit();
    drawChart();
    drawHistory();
  });
})();
