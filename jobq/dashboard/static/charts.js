// jobq dashboard: the overview's history charts, drawn with uPlot (vendored, served by jobq).
// Reads /dashboard/history?window=1h|24h (JSON: per queue, jobs/s and percentiles a point a
// step) and draws two charts per queue: throughput (enqueued, succeeded, failed per second) and
// latency (pickup lag and run time, p50 and p95). Redraws every minute and on a window change.
(function () {
  "use strict";
  var section = document.getElementById("charts");
  if (!section || typeof uPlot === "undefined") { return; }
  var list = document.getElementById("chart-list");
  var source = section.dataset.history;
  var windowName = "1h";
  var EVERY_MS = 60000;

  function short(v) {  // three significant digits, never an exponent: 250, 2.5, 0.025
    return String(Number(v.toPrecision(3)));
  }

  function seconds(v) {
    if (v === null || v === undefined) { return "–"; }
    if (v === 0) { return "0"; }
    if (v < 1) { return short(v * 1000) + " ms"; }
    if (v < 60) { return short(v) + " s"; }
    return short(v / 60) + " min";
  }

  function perSecond(v) {
    if (v === null || v === undefined) { return "–"; }
    return v >= 1000 ? v.toFixed(0) : short(v);
  }

  var THROUGHPUT = [
    { key: "enqueued", label: "enqueued/s", stroke: "#2455c3" },
    { key: "succeeded", label: "succeeded/s", stroke: "#18794e" },
    { key: "failed", label: "failed/s", stroke: "#b42318" },
  ];
  var LATENCY = [
    { key: "pickup_p50", label: "pickup p50", stroke: "#7a3fd1" },
    { key: "pickup_p95", label: "pickup p95", stroke: "#7a3fd1", dash: [6, 4] },
    { key: "run_p50", label: "run p50", stroke: "#c26a00" },
    { key: "run_p95", label: "run p95", stroke: "#c26a00", dash: [6, 4] },
  ];

  function chart(parent, title, queue, series, format) {
    var figure = document.createElement("figure");
    var caption = document.createElement("figcaption");
    caption.textContent = title;
    figure.appendChild(caption);
    parent.appendChild(figure);
    var width = Math.max(240, Math.min(parent.clientWidth || 540, 620));
    var options = {
      width: width,
      height: 170,
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true } },
      axes: [
        { stroke: "#667085" },
        { stroke: "#667085", size: 70, values: function (u, vals) { return vals.map(format); } },
      ],
      series: [{}].concat(series.map(function (s) {
        return { label: s.label, stroke: s.stroke, dash: s.dash, width: 1.5, spanGaps: false,
          value: function (u, v) { return format(v); } };
      })),
    };
    var data = [queue.t].concat(series.map(function (s) { return queue[s.key]; }));
    new uPlot(options, data, figure);
    figure.dataset.points = String(queue.t.length);
    return figure;
  }

  var last = null;

  function draw(data) {
    last = data;
    list.textContent = "";
    if (!data.queues.length) {
      var empty = document.createElement("p");
      empty.className = "empty";
      empty.textContent = "No history yet: the leader writes a row a minute while a worker runs.";
      list.appendChild(empty);
      return;
    }
    data.queues.forEach(function (queue) {
      var box = document.createElement("div");
      box.className = "chart";
      box.dataset.queue = queue.name;
      var heading = document.createElement("h3");
      heading.textContent = queue.name;
      box.appendChild(heading);
      list.appendChild(box);
      chart(box, "jobs per second", queue, THROUGHPUT, perSecond);
      chart(box, "pickup lag and run time", queue, LATENCY, seconds);
    });
  }

  function load() {
    if (document.hidden) { return; }
    fetch(source + "?window=" + encodeURIComponent(windowName), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) { throw new Error("status " + response.status); }
        return response.json();
      })
      .then(draw)
      .catch(function () { section.classList.add("stale"); });
  }

  section.querySelectorAll("[data-window]").forEach(function (button) {
    button.addEventListener("click", function () {
      windowName = button.dataset.window;
      section.querySelectorAll("[data-window]").forEach(function (b) {
        b.setAttribute("aria-pressed", String(b === button));
      });
      load();
    });
  });
  var resizing = null;
  window.addEventListener("resize", function () {  // a narrower window: redraw to fit
    window.clearTimeout(resizing);
    resizing = window.setTimeout(function () { if (last) { draw(last); } }, 150);
  });
  load();
  window.setInterval(load, EVERY_MS);
})();
