// reliable-queue dashboard: live counters and charts from the `events` stream. No framework,
// no external script. Every value from the server is put into the page as text, never HTML.
(function () {
  "use strict";
  var base = document.body.getAttribute("data-base") || "";
  var table = document.getElementById("queues");
  var overview = document.getElementById("throughput") !== null;
  if (!table) { return; }
  var history = [];
  var KEEP = 900;

  function human(ms) {
    var s = Math.floor(ms / 1000);
    if (s < 1) { return ms + "ms"; }
    if (s < 60) { return s + "s"; }
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (s < 3600) { return Math.floor(s / 60) + "m" + pad(s % 60) + "s"; }
    if (s < 86400) { return Math.floor(s / 3600) + "h" + pad(Math.floor(s % 3600 / 60)) + "m"; }
    return Math.floor(s / 86400) + "d" + pad(Math.floor(s % 86400 / 3600)) + "h";
  }

  function setText(cell, text) { if (cell && cell.textContent !== text) { cell.textContent = text; } }

  function row(q) {
    var rows = table.querySelectorAll("tr[data-queue]");
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].getAttribute("data-queue") === q.queue) { return rows[i]; }
    }
    if (!overview) { return null; }
    // A queue made since the page loaded: a new row, built from text nodes.
    var tr = document.createElement("tr");
    tr.setAttribute("data-queue", q.queue);
    var name = document.createElement("td");
    var link = document.createElement("a");
    link.href = base + "/queues/" + encodeURIComponent(q.queue);
    link.textContent = q.queue;
    name.appendChild(link);
    tr.appendChild(name);
    ["ready", "delayed", "leased", "held", "dead", "oldest"].forEach(function (f) {
      var td = document.createElement("td");
      td.className = "n";
      td.setAttribute("data-field", f);
      tr.appendChild(td);
    });
    table.querySelector("tbody").appendChild(tr);
    var empty = document.getElementById("empty");
    if (empty) { empty.remove(); }
    return tr;
  }

  function update(snapshot) {
    (snapshot.queues || []).forEach(function (q) {
      var tr = row(q);
      if (!tr) { return; }
      ["ready", "delayed", "leased", "held"].forEach(function (f) {
        setText(tr.querySelector('[data-field="' + f + '"]'), String(q[f]));
      });
      var dead = tr.querySelector('[data-field="dead"]');
      var link = dead && dead.querySelector("a");
      setText(link || dead, String(q.dead));
      setText(tr.querySelector('[data-field="oldest"]'), q.oldest_ms == null ? "-" : human(q.oldest_ms));
    });
    var status = document.getElementById("status");
    if (status) {
      setText(status, snapshot.error ? "The last read failed: " + snapshot.error
        : "Updated live, every second. Last read " + new Date(snapshot.at_ms).toLocaleTimeString() + ".");
    }
    if (snapshot.point) {
      history.push(snapshot.point);
      if (history.length > KEEP) { history.shift(); }
      draw();
    }
  }

  var SVG = "http://www.w3.org/2000/svg";
  function chart(id, keys) {
    var svg = document.getElementById(id);
    if (!svg) { return; }
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    if (history.length < 2) { return; }
    var max = 1;
    history.forEach(function (p) { keys.forEach(function (k) { if (p[k] > max) { max = p[k]; } }); });
    var t0 = history[0].t_ms, t1 = history[history.length - 1].t_ms, span = Math.max(1, t1 - t0);
    keys.forEach(function (k, i) {
      var line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", "s" + i);
      line.setAttribute("points", history.map(function (p) {
        var x = (p.t_ms - t0) / span * 600, y = 155 - p[k] / max * 145;
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" "));
      svg.appendChild(line);
    });
    var label = document.getElementById(id + "-max");
    if (label) { setText(label, "top: " + (max >= 100 ? Math.round(max) : max.toFixed(1))); }
  }
  function draw() {
    chart("throughput", ["enqueued", "done", "failed", "dead_lettered"]);
    chart("depth", ["ready", "delayed", "leased", "dead"]);
  }

  function listen() {
    if (!window.EventSource) { return; }
    var source = new EventSource(base + "/events");
    source.addEventListener("snapshot", function (e) {
      try { update(JSON.parse(e.data)); } catch (err) { /* a malformed event is skipped */ }
    });
  }

  if (overview) {
    fetch(base + "/api/history").then(function (r) { return r.json(); }).then(function (points) {
      history = points.concat(history).slice(-KEEP);
      draw();
    }).catch(function () {}).then(listen);
  } else {
    listen();
  }
}());
