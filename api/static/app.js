// The node's web page: reads the REST API this page was served by, and nothing else.
// It shows the node, its topics, trees, peers, metrics, live events and a topic's durable
// consumers, refreshed every two seconds; forms publish, subscribe and add or delete a
// consumer with the token the user gives.
//
// Every value from the API (topic names, payloads, peer ids) came off the network, so it
// only ever becomes text (textContent, createTextNode), never markup. The token the user
// types lives in a variable of this page: it is sent with state-changing calls only and
// never stored.
"use strict";

(() => {
  const REFRESH_MS = 2000;        // how often the node's state is read again
  const NAMES_MS = 15000;         // topic names and versions change rarely
  const RECENT_EVENTS = 20;       // history shown when a topic is first watched
  const MAX_ROWS = 200;           // events kept on the page
  const REOPEN_MS = 1000;         // wait before reopening a stream the browser gave up
  const ARM_MS = 5000;            // a delete button asks again for this long

  const state = {
    token: "",
    topics: new Map(),            // topic CID -> {name, versions, checked}
    subscriptions: new Map(),     // topic CID -> delivery-log position
    previous: null,               // the last metrics reading, for rates
    started: null,                // when the node's API started (seconds, node's clock)
    restarted: null,              // when the page last saw the node restart
    live: null,                   // {cid, lastSeq, source, timer}
    armed: null,                  // {cid, name, until}: a consumer's delete asked to confirm
    consumersShown: "",           // what the consumer table shows, to rebuild it on change only
  };

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------- building DOM as text

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function replaceChildren(parent, children) {
    parent.replaceChildren(...children);
  }

  function shortId(text) {
    const value = String(text);
    return value.length > 20 ? `${value.slice(0, 10)}…${value.slice(-6)}` : value;
  }

  function idCell(text) {
    return el("td", { class: "mono", title: text }, shortId(text));
  }

  function formatBytes(count) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = Number(count);
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
  }

  function formatUptime(seconds) {
    const total = Math.floor(Number(seconds));
    const d = Math.floor(total / 86400);
    const h = Math.floor((total % 86400) / 3600);
    const m = Math.floor((total % 3600) / 60);
    const s = total % 60;
    const pad = (n) => String(n).padStart(2, "0");
    return d > 0 ? `${d}d ${pad(h)}h ${pad(m)}m` : `${h}h ${pad(m)}m ${pad(s)}s`;
  }

  // A payload as it was published: JSON as compact JSON, text as text (the API adds those
  // fields when the event's signed content_type says so), else the bytes as UTF-8 if
  // they decode, or their size.
  function showPayload(event) {
    if ("json" in event) return JSON.stringify(event.json);
    if ("text" in event) return event.text;
    const shown = decodePayload(event.payload);
    return event.content_type ? `${shown} [${event.content_type}]` : shown;
  }

  function decodePayload(base64) {
    const binary = atob(base64);
    const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      return `(${bytes.length} bytes, binary)`;
    }
  }

  function setBadge(id, kind, text) {
    const badge = $(id);
    badge.dataset.state = kind;
    badge.textContent = text;
  }

  // ---------------------------------------------------------------- talking to the API

  class ApiError extends Error {}

  async function problemOf(response) {
    // Problem documents (RFC 9457) say what went wrong; anything else is shown as status.
    let text = `${response.status} ${response.statusText}`;
    try {
      const problem = await response.json();
      if (problem && typeof problem.title === "string") {
        text = `${response.status} ${problem.title}: ${problem.detail}`;
      }
    } catch {
      // not JSON: the status line is all there is
    }
    return new ApiError(text);
  }

  async function getJson(path) {
    const response = await fetch(path, { cache: "no-store" });
    if (!response.ok) throw await problemOf(response);
    return response.json();
  }

  // A state-changing call, with the token if the user gave one: [status, answer].
  async function request(method, path, body) {
    const headers = {};
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (!response.ok) throw await problemOf(response);
    return [response.status, response.status === 204 ? null : await response.json()];
  }

  async function send(method, path, body) {
    return (await request(method, path, body))[1];
  }

  const topicPath = (cid) => encodeURIComponent(cid);

  // ---------------------------------------------------------------- node, metrics, peers

  function showNode(node, health) {
    $("peer-id").textContent = node.peer_id;
    $("p2p-address").textContent = `${node.address.host}:${node.address.port} (UDP DHT, TCP pub-sub)`;
    $("api-address").textContent = node.api;
    $("uptime").textContent = formatUptime(health.uptime_s);
    $("subscription-count").textContent = String(health.subscriptions);
  }

  // [label, value, detail]: the detail (a rate) is shown under the value, with the label.
  const TILES = [
    ["deliveries/s", (m, r) => (r && r.delivered !== null ? r.delivered.toFixed(1) : "—")],
    ["delivered", (m) => m.node.delivered],
    ["published", (m) => m.node.published],
    ["backfilled", (m) => m.node.backfilled],
    ["grafts", (m) => m.node.grafts],
    ["prunes", (m) => m.node.prunes],
    ["duplicates", (m) => m.node.duplicates],
    ["bytes sent", (m) => formatBytes(m.transport.bytes_sent),
      (r) => (r && r.sent !== null ? `${formatBytes(r.sent)}/s` : null)],
    ["bytes received", (m) => formatBytes(m.transport.bytes_received),
      (r) => (r && r.received !== null ? `${formatBytes(r.received)}/s` : null)],
  ];

  function rates(now, before) {
    // Counters restart at 0 with the node: a smaller reading is a restart, not a rate.
    if (!before || now.at <= before.at) return null;
    if (Math.abs(now.at - now.uptime_s - (before.at - before.uptime_s)) > 0.5) return null;
    const span = now.at - before.at;
    const rate = (a, b) => (a >= b ? (a - b) / span : null);
    return {
      delivered: rate(now.node.delivered || 0, before.node.delivered || 0),
      sent: rate(now.transport.bytes_sent, before.transport.bytes_sent),
      received: rate(now.transport.bytes_received, before.transport.bytes_received),
    };
  }

  function showMetrics(metrics) {
    const r = rates(metrics, state.previous);
    state.previous = metrics;
    replaceChildren($("metric-tiles"), TILES.map(([label, value, detail]) => {
      const extra = detail ? detail(r) : null;
      return el("div", { class: "tile", "data-metric": label },
        el("span", { class: "value" }, value(metrics, r) ?? 0),
        el("span", { class: "label" }, extra ? `${label} · ${extra}` : label));
    }));
  }

  function showPeers(routing) {
    replaceChildren($("peer-rows"), routing.contacts.map((c) => el("tr", {},
      c.peer_id ? idCell(c.peer_id) : el("td", { class: "note" }, "(not proven yet)"),
      el("td", { class: "mono" }, `${c.host}:${c.port}`),
      idCell(c.kademlia_id))));
  }

  // ---------------------------------------------------------------- topics and trees

  function topicName(cid) {
    const known = state.topics.get(cid);
    return known && known.name !== null ? known.name : shortId(cid);
  }

  async function learnNames(cids) {
    const now = Date.now();
    await Promise.all(cids.map(async (cid) => {
      const known = state.topics.get(cid);
      if (known && now - known.checked < NAMES_MS) return;
      try {
        const answer = await getJson(`/v1/topics/${topicPath(cid)}/versions`);
        state.topics.set(cid, {
          name: answer.versions[0].name, versions: answer.versions.length, checked: now,
        });
      } catch {
        if (!known) state.topics.set(cid, { name: null, versions: null, checked: now });
      }
    }));
  }

  function roleOf(tree) {
    if (!tree) return "";
    if (tree.is_root) return "root";
    return tree.attached ? "member" : "joining";
  }

  function showTopics(trees) {
    const byTopic = new Map(trees.map((t) => [t.topic, t]));
    const cids = [...new Set([...state.subscriptions.keys(), ...byTopic.keys()])];
    cids.sort((a, b) => topicName(a).localeCompare(topicName(b)));
    $("no-topics").hidden = cids.length > 0;
    replaceChildren($("topic-rows"), cids.map((cid) => {
      const known = state.topics.get(cid);
      const subscribed = state.subscriptions.has(cid);
      const watch = el("button", { type: "button", class: "small" }, "watch");
      watch.disabled = !subscribed;
      watch.addEventListener("click", () => {
        $("live-topic").value = cid;
        watchTopic(cid);
      });
      return el("tr", { "data-topic": cid },
        el("td", { class: "topic-name" }, topicName(cid)),
        idCell(cid),
        el("td", {}, known && known.versions !== null ? known.versions : "?"),
        // A topic's meta topic is followed with it: its tree delivers, unasked.
        el("td", {}, subscribed ? "yes" : byTopic.get(cid)?.subscribed ? "with its topic" : "no"),
        el("td", {}, subscribed ? state.subscriptions.get(cid) : ""),
        el("td", {}, roleOf(byTopic.get(cid))),
        el("td", {}, watch));
    }));
    fillTopicSelect($("publish-topic"), cids);
    fillTopicSelect($("live-topic"), [...state.subscriptions.keys()]);
    fillTopicSelect($("consumer-topic"), [...state.subscriptions.keys()]);
  }

  function fillTopicSelect(select, cids) {
    // Rebuilt only when the list changes, so an open drop-down is not reset each refresh.
    const wanted = cids.join(" ");
    if (select.dataset.topics === wanted) {
      for (const option of select.options) option.textContent = topicName(option.value);
      return;
    }
    const chosen = select.value;
    select.dataset.topics = wanted;
    replaceChildren(select, cids.map((cid) => el("option", { value: cid }, topicName(cid))));
    if (cids.includes(chosen)) select.value = chosen;
  }

  function peerList(peers, rtt) {
    if (peers.length === 0) return el("span", { class: "note" }, "none");
    return el("ul", { class: "peers" }, ...peers.map((peer) => {
      const sample = rtt[peer];
      return el("li", { title: peer },
        el("span", { class: "mono" }, shortId(peer)),
        el("span", { class: "rtt" }, sample ? `${sample.srtt_ms.toFixed(2)} ms` : "RTT —"));
    }));
  }

  function showTrees(trees) {
    const sorted = [...trees].sort((a, b) => topicName(a.topic).localeCompare(topicName(b.topic)));
    replaceChildren($("tree-cards"), sorted.map((tree) => el("div",
      { class: "tree", "data-topic": tree.topic },
      el("h3", {}, topicName(tree.topic), " ",
        el("span", { class: "badge", "data-state": tree.subscribed ? "live" : "idle" },
          tree.subscribed ? "subscribed" : "relay"),
        " ", el("span", { class: "badge", "data-state": "idle" }, roleOf(tree))),
      el("dl", {},
        ...["parents", "children", "lazy", "grafted"].flatMap((role) => [
          el("dt", {}, role),
          el("dd", { "data-role": role }, peerList(tree[role], tree.rtt))])))));
  }

  // ---------------------------------------------------------------- durable consumers

  function deliverText(policy) {
    if (typeof policy === "string") return policy;
    if (policy && "start_seq" in policy) return `from #${policy.start_seq}`;
    if (policy && "start_time" in policy) {
      return `from ${new Date(policy.start_time * 1000).toLocaleString()}`;
    }
    return "?";
  }

  function ackText(config) {
    if (config.ack_policy === "none") return "ack none";
    const parts = [`ack ${config.ack_policy}`, `wait ${config.ack_wait} s`];
    if (config.max_deliver !== -1) parts.push(`max ${config.max_deliver} deliveries`);
    return parts.join(", ");
  }

  // A counter's cell; ``warning`` (a reason, or null) marks what an operator should see.
  function counterCell(field, value, warning) {
    const cell = el("td", { class: "number", "data-field": field, title: warning }, value);
    if (warning) cell.dataset.state = "warn";
    return cell;
  }

  function isArmed(cid, name) {
    const armed = state.armed;
    return armed !== null && armed.cid === cid && armed.name === name && Date.now() < armed.until;
  }

  function deleteButton(cid, name) {
    const armed = isArmed(cid, name);
    const button = el("button", { type: "button", class: armed ? "small danger" : "small",
      "data-action": "delete" }, armed ? "really delete?" : "delete");
    button.addEventListener("click", () => {
      if (isArmed(cid, name)) {
        state.armed = null;
        deleteConsumer(cid, name);
        return;
      }
      // Deleting drops the consumer's place and what it had pending: ask once more.
      state.armed = { cid, name, until: Date.now() + ARM_MS };
      button.textContent = "really delete?";
      button.classList.add("danger");
    });
    return button;
  }

  function consumerRow(cid, c) {
    const config = c.config;
    const full = c.num_ack_pending >= config.max_ack_pending
      ? "at max_ack_pending: nothing more is handed out until some are acknowledged" : null;
    const setAside = c.num_max_deliver_reached > 0
      ? `${c.num_max_deliver_reached} set aside after max_deliver deliveries` : null;
    const skipped = c.num_skipped > 0
      ? `retention cut these before it read them (last ${(c.last_skipped || []).join("-")})` : null;
    return el("tr", { "data-consumer": c.name },
      el("td", { class: "mono consumer-name" }, c.name),
      el("td", { "data-field": "policies" },
        `${deliverText(config.deliver_policy)} · ${ackText(config)}`),
      counterCell("delivered", c.delivered, null),
      counterCell("ack_floor", c.ack_floor, null),
      counterCell("num_pending", c.num_pending, null),
      counterCell("num_ack_pending", `${c.num_ack_pending} / ${config.max_ack_pending}`, full),
      counterCell("num_redelivered", c.num_redelivered, null),
      counterCell("terminated", `${c.num_terminated} · ${c.num_max_deliver_reached}`, setAside),
      counterCell("num_skipped", c.num_skipped, skipped),
      groupCell(c.group),
      el("td", {}, deleteButton(cid, c.name)));
  }

  // A group member: its group, the members it sees, and what it watches and took over.
  function groupCell(group) {
    if (!group) return el("td", { "data-field": "group" }, "—");
    const names = group.members.map((m) => m.me ? `${m.name} (here)` : m.name).join(", ");
    const state = group.ready ? "" : " · joining";
    const title = `view ${group.epoch}: ${names}; ${group.num_watched} watched for other `
      + `members, ${group.taken_over} taken over, ${group.duplicates} also handled elsewhere`;
    return el("td", { "data-field": "group", title },
      `${group.name} · ${group.members.length} members${state}`);
  }

  function showConsumers(cid, consumers) {
    // Rebuilt only when something changed, so a button is not replaced under the pointer.
    const armed = consumers.filter((c) => isArmed(cid, c.name)).map((c) => c.name);
    const shown = JSON.stringify([cid, consumers, armed]);
    if (shown === state.consumersShown) return;
    state.consumersShown = shown;
    const none = $("no-consumers");
    none.hidden = consumers.length > 0;
    none.textContent = cid ? "No consumers of this topic here."
      : "Consumers read a topic this node follows: subscribe to one first.";
    replaceChildren($("consumer-rows"), consumers.map((c) => consumerRow(cid, c)));
  }

  async function refreshConsumers() {
    const cid = $("consumer-topic").value;
    if (!cid) {
      showConsumers("", []);
      return;
    }
    try {
      const answer = await getJson(`/v1/topics/${topicPath(cid)}/consumers`);
      if ($("consumer-topic").value !== cid) return;  // another topic was chosen meanwhile
      showConsumers(cid, answer.consumers);
      $("consumer-status").textContent = "";
    } catch (error) {
      $("consumer-status").textContent = error.message;
    }
  }

  async function deleteConsumer(cid, name) {
    try {
      await send("DELETE", `/v1/topics/${topicPath(cid)}/consumers/${encodeURIComponent(name)}`);
      showResult("consumer-result", true, `deleted consumer ${name}`);
    } catch (error) {
      showResult("consumer-result", false, error.message);
    }
    state.consumersShown = "";
    await refreshConsumers();
  }

  async function onAddConsumer(submit) {
    submit.preventDefault();
    const cid = $("consumer-topic").value;
    if (!cid) {
      showResult("consumer-result", false, "subscribe to a topic first: a consumer reads "
        + "the log of a topic this node follows");
      return;
    }
    const name = $("consumer-name").value.trim();
    const body = { name, deliver_policy: $("consumer-deliver").value,
      ack_policy: $("consumer-ack").value };
    const wait = $("consumer-ack-wait").value.trim();
    if (wait !== "") body.ack_wait = Number(wait);
    const max = $("consumer-max-deliver").value.trim();
    if (max !== "") body.max_deliver = Number(max);
    const group = $("consumer-group").value.trim();
    if (group !== "") body.group = group;
    try {
      const [status] = await request("POST", `/v1/topics/${topicPath(cid)}/consumers`, body);
      showResult("consumer-result", true, status === 201 ? `added consumer ${name}`
        : `consumer ${name} exists with these settings`);
    } catch (error) {
      showResult("consumer-result", false, error.message);
    }
    await refreshConsumers();
  }

  // ---------------------------------------------------------------- the refresh loop

  async function refresh() {
    try {
      const [node, health, subs, trees, metrics, routing] = await Promise.all([
        getJson("/v1/node"), getJson("/v1/health"), getJson("/v1/subscriptions"),
        getJson("/v1/node/trees"), getJson("/v1/node/metrics"),
        getJson("/v1/node/routing?k=20"),
      ]);
      state.subscriptions = new Map(subs.subscriptions.map((s) => [s.topic, s.position]));
      await learnNames([...new Set([...state.subscriptions.keys(),
        ...trees.trees.map((t) => t.topic)])]);
      // When the API started, by the node's clock: if that moved, the node restarted.
      const started = metrics.at - metrics.uptime_s;
      if (state.started !== null && Math.abs(started - state.started) > 0.5) {
        state.restarted = new Date().toLocaleTimeString();
      }
      state.started = started;
      showNode(node, health);
      showMetrics(metrics);
      showTopics(trees.trees);
      showTrees(trees.trees);
      showPeers(routing);
      await refreshConsumers();
      setBadge("status", "live", state.restarted
        ? `connected (node restarted at ${state.restarted})` : "connected");
      if (!state.live && state.subscriptions.size > 0) {
        watchTopic($("live-topic").value || state.subscriptions.keys().next().value);
      }
    } catch (error) {
      setBadge("status", "down", `node unreachable, retrying (${error.message})`);
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  // ---------------------------------------------------------------- live events (SSE)

  function addEventRow(seq, event) {
    const rows = $("event-rows");
    const delivered = event.delivered_at
      ? new Date(event.delivered_at * 1000).toLocaleTimeString() : "";
    rows.prepend(el("tr", { "data-seq": seq },
      el("td", {}, seq), el("td", {}, delivered), idCell(event.cid),
      idCell(event.publisher), el("td", { class: "payload" }, showPayload(event))));
    while (rows.children.length > MAX_ROWS) rows.lastElementChild.remove();
  }

  function closeLive() {
    const live = state.live;
    if (!live) return;
    if (live.source) live.source.close();
    clearTimeout(live.timer);
    state.live = null;
  }

  function watchTopic(cid) {
    if (!cid) return;
    if (state.live && state.live.cid === cid) return;
    closeLive();
    replaceChildren($("event-rows"), []);
    const position = state.subscriptions.get(cid) || 0;
    state.live = { cid, lastSeq: Math.max(0, position - RECENT_EVENTS), source: null, timer: 0 };
    openStream(state.live);
  }

  function openStream(live) {
    // ``from`` = the last position shown: the node sends what follows it, from its log,
    // then live. While the stream is open the browser itself reconnects after a drop and
    // sends Last-Event-ID; a stream the browser gave up on (a refused answer while the
    // node restarts) is reopened here from the same position, so nothing is lost.
    const source = new EventSource(`/v1/topics/${topicPath(live.cid)}/stream?from=${live.lastSeq}`);
    live.source = source;
    setBadge("live-status", "connecting", "connecting…");
    source.addEventListener("open", () => setBadge("live-status", "live", "live"));
    source.addEventListener("event", (message) => {
      const seq = Number(message.lastEventId);
      if (!(seq > live.lastSeq)) return;  // already shown
      live.lastSeq = seq;
      addEventRow(seq, JSON.parse(message.data));
    });
    source.addEventListener("end", (message) => {
      let reason = "ended";
      try {
        reason = JSON.parse(message.data).reason;
      } catch {
        // keep the default
      }
      if (reason === "unsubscribed") {
        source.close();
        setBadge("live-status", "idle", "ended: unsubscribed");
      } else {
        setBadge("live-status", "connecting", `reconnecting (${reason})`);
      }
    });
    source.addEventListener("error", () => {
      if (state.live !== live) return;
      if (source.readyState === EventSource.CLOSED) {
        setBadge("live-status", "down", "stream lost, reopening…");
        clearTimeout(live.timer);
        live.timer = setTimeout(() => {
          if (state.live === live) openStream(live);
        }, REOPEN_MS);
      } else {
        setBadge("live-status", "connecting", "reconnecting…");
      }
    });
  }

  // ---------------------------------------------------------------- forms

  function showResult(id, ok, text) {
    const output = $(id);
    output.dataset.state = ok ? "ok" : "error";
    output.textContent = text;
  }

  async function onSubscribe(submit) {
    submit.preventDefault();
    const cid = $("subscribe-cid").value.trim();
    const replay = $("subscribe-replay").checked ? "true" : "false";
    try {
      const answer = await send("PUT", `/v1/subscriptions/${topicPath(cid)}?replay=${replay}`);
      showResult("subscribe-result", true, `subscribed to ${answer.topic} at position ${answer.position}`);
    } catch (error) {
      showResult("subscribe-result", false, error.message);
    }
  }

  async function onPublish(submit) {
    submit.preventDefault();
    const cid = $("publish-topic").value;
    const text = $("publish-payload").value;
    let body;
    if ($("publish-json").checked) {
      try {
        body = { json: JSON.parse(text) };
      } catch (error) {
        showResult("publish-result", false, `not JSON: ${error.message}`);
        return;
      }
    } else {
      body = { text };
    }
    try {
      const event = await send("POST", `/v1/topics/${topicPath(cid)}/events`, body);
      showResult("publish-result", true, `published ${event.cid} (${event.payload_size} bytes)`);
    } catch (error) {
      showResult("publish-result", false, error.message);
    }
  }

  function start() {
    $("token").addEventListener("input", (input) => {
      state.token = input.target.value.trim();
    });
    $("token-form").addEventListener("submit", (submit) => submit.preventDefault());
    $("subscribe-form").addEventListener("submit", onSubscribe);
    $("publish-form").addEventListener("submit", onPublish);
    $("consumer-form").addEventListener("submit", onAddConsumer);
    $("consumer-topic").addEventListener("change", () => refreshConsumers());
    $("live-topic").addEventListener("change", (change) => watchTopic(change.target.value));
    refresh();
  }

  start();
})();
