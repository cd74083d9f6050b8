// The console's publish-rate chart (docs/web.md): a line on a canvas with its axes, a
// vertical one in events/s and a horizontal one in time before now. app.js calls
// `eventbusRateChart(canvas, points, options)` after each poll.
'use strict';
(() => {
  /** The smallest 1, 2 or 5 × 10^n at least `v` (the chart's top). */
  function niceCeil(v) {
    const base = 10 ** Math.floor(Math.log10(Math.max(v, 1e-9)));
    return [1, 2, 5, 10].map((m) => m * base).find((m) => m >= v - 1e-9);
  }

  /** The publish rate over the last maxPoints polls: a vertical axis in events/s
   * (0, half, top), a horizontal one in time before now. */
  function drawChart(canvas, points, { pollMs, maxPoints, fmtRate }) {
    const ratio = window.devicePixelRatio || 1;
    const W = canvas.clientWidth || 1200;
    const H = canvas.clientHeight || 180;
    if (canvas.width !== Math.round(W * ratio)) canvas.width = Math.round(W * ratio);
    if (canvas.height !== Math.round(H * ratio)) canvas.height = Math.round(H * ratio);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, W, H);
    const style = getComputedStyle(canvas);
    const muted = getComputedStyle(document.documentElement).getPropertyValue('--muted').trim() || style.color;
    // Plot area: room on the left for the rates, at the bottom for the times.
    const left = 72, right = W - 12, top = 10, bottom = H - 26;
    const ceiling = niceCeil(Math.max(1, ...points));
    const yTicks = [0, ceiling / 2, ceiling];
    const fmtTick = (v) => (Number.isInteger(v) ? v.toLocaleString('en') : String(Number(v.toPrecision(3))));
    const span = (maxPoints * pollMs) / 1000;
    const xTicks = [span, (span * 3) / 4, span / 2, span / 4, 0];
    const xLabel = (secondsAgo) => (secondsAgo === 0 ? 'now' : secondsAgo % 60 === 0 ? `−${secondsAgo / 60} min` : `−${Math.round(secondsAgo)} s`);
    const x = (secondsAgo) => right - (secondsAgo / span) * (right - left);
    const y = (v) => bottom - (v / ceiling) * (bottom - top);
    canvas.dataset.points = String(points.length);
    canvas.dataset.yUnit = 'events/s';
    canvas.dataset.yTicks = yTicks.map(fmtTick).join(',');
    canvas.dataset.xTicks = xTicks.map(xLabel).join(',');
    const latest = points.length ? points[points.length - 1] : null;
    canvas.setAttribute('aria-label', `Publish rate in events per second over the last 2 minutes; latest ${fmtRate(latest)} events/s, scale 0 to ${fmtTick(ceiling)} events/s`);

    ctx.font = '11px system-ui, sans-serif';
    ctx.lineWidth = 1;
    ctx.strokeStyle = style.borderColor;
    ctx.fillStyle = muted;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (const v of yTicks) {
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(left, yy);
      ctx.lineTo(right, yy);
      ctx.stroke();
      ctx.fillText(`${fmtTick(v)} /s`, left - 8, yy);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    for (const t of xTicks) {
      const xx = Math.round(x(t)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(xx, bottom);
      ctx.lineTo(xx, bottom + 4);
      ctx.stroke();
      ctx.textAlign = t === 0 ? 'right' : t === span ? 'left' : 'center';
      ctx.fillText(xLabel(t), xx, bottom + 8);
    }
    ctx.save();
    ctx.translate(12, (top + bottom) / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    ctx.fillText('events/s', 0, 0);
    ctx.restore();
    if (points.length < 2) return;
    const at = (i) => x(((points.length - 1 - i) * pollMs) / 1000);
    ctx.strokeStyle = style.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.forEach((v, i) => {
      if (i) ctx.lineTo(at(i), y(v));
      else ctx.moveTo(at(i), y(v));
    });
    ctx.stroke();
    ctx.lineTo(at(points.length - 1), bottom);
    ctx.lineTo(at(0), bottom);
    ctx.closePath();
    ctx.globalAlpha = 0.12;
    ctx.fillStyle = style.color;
    ctx.fill();
    ctx.globalAlpha = 1;
  }

  window.eventbusRateChart = drawChart;
})();
