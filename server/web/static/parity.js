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

  function axes(ctx, box, lo, hi, n) {
    ctx.strokeStyle = "#d9dee7"; ctx.fillStyle = "#667085"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
    for (let e = Math.log10(lo); e <= Math.log10(hi) + 1e-9; e++) {
      const y = box.y(Math.pow(10, e));
      ctx.beginPath(); ctx.moveTo(box.left, y); ctx.lineTo(box.right, y); ctx.stroke();
      ctx.fillText("1e" + e, 4, y + 4);
    }
    ctx.fillText("execution order (" + n + " calls) →", box.left, box.bottom + 16);
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
    const box = { left: 48, right: width - 10, top: 10, bottom: height - 24 };
    // x is the call's place in execution order; with a decimated series the kept calls keep their place.
    box.x = function (i) {
      const seq = d.seq ? d.seq[i] : i;
      return box.left + (total > 1 ? seq / (total - 1) : 0.5) * (box.right - box.left);
    };
    box.y = function (v) {
      const t = (Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo));
      return box.bottom - t * (box.bottom - box.top);
    };
    axes(ctx, box, lo, hi, total);
    let drawn = 0;
    let divergence = -1;
    for (let i = 0; i < n; i++) {
      if (d.api[i] === d.first_divergence) divergence = i;
      const colour = d.backward[i] ? "#e07b00" : "#2457c5";
      const failing = d.status[i] === "fail" || d.status[i] === "unmatched";
      if (d.rel[i] !== null) {
        ctx.fillStyle = colour;
        ctx.beginPath(); ctx.arc(box.x(i), box.y(d.rel[i]), failing ? 3.2 : 2, 0, 2 * Math.PI); ctx.fill();
        drawn++;
      }
      if (d.cos[i] !== null && d.cos[i] > 0) {
        ctx.strokeStyle = colour;
        ctx.beginPath(); ctx.arc(box.x(i), box.y(d.cos[i]), 3, 0, 2 * Math.PI); ctx.stroke();
        drawn++;
      }
    }
    if (divergence >= 0) {
      const x = box.x(divergence);
      ctx.strokeStyle = "#d00000"; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(x, box.top); ctx.lineTo(x, box.bottom); ctx.stroke();
      ctx.fillStyle = "#d00000"; ctx.font = "12px sans-serif";
      const label = "first divergence: " + d.first_divergence;
      ctx.fillText(label, Math.min(x + 4, box.right - ctx.measureText(label).width), box.top + 12);
    }
    canvas.dataset.points = String(drawn);
    canvas.dataset.divergence = String(divergence);
    canvas.dataset.drawn = "1";
    const info = document.getElementById("chart-info");
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
      if (i >= 0 && info) {
        info.textContent = "#" + i + " " + d.api[i] + " · " + d.status[i] + " · MaxRelativeErr " +
          (d.rel[i] === null ? "n/a" : d.rel[i].toPrecision(3)) + " · 1 − cosine " +
          (d.cos[i] === null ? "n/a" : d.cos[i].toPrecision(3));
      }
    });
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

  function drawHistory() {
    const canvas = document.getElementById("history-chart");
    if (!canvas) return;
    const values = JSON.parse(canvas.dataset.history || "[]");
    const n = values.length;
    const { ctx, width, height } = setupCanvas(canvas);
    const [lo, hi] = logRange(values);
    const box = { left: 48, right: width - 10, top: 10, bottom: height - 24 };
    box.x = function (i) { return box.left + (n > 1 ? i / (n - 1) : 0.5) * (box.right - box.left); };
    box.y = function (v) {
      const t = (Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo));
      return box.bottom - t * (box.bottom - box.top);
    };
    axes(ctx, box, lo, hi, n);
    ctx.strokeStyle = "#2457c5"; ctx.fillStyle = "#2457c5"; ctx.lineWidth = 1.5;
    ctx.beginPath();
    let started = false;
    values.forEach(function (v, i) {
      if (v === null) return;
      if (started) ctx.lineTo(box.x(i), box.y(v)); else { ctx.moveTo(box.x(i), box.y(v)); started = true; }
    });
    ctx.stroke();
    values.forEach(function (v, i) {
      if (v !== null) { ctx.beginPath(); ctx.arc(box.x(i), box.y(v), 3, 0, 2 * Math.PI); ctx.fill(); }
    });
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
