// The eventbusd console (docs/web.md): plain JavaScript, no build step, nothing loaded
// from elsewhere. It calls the broker's own routes with the operator's credential
// (sessionStorage, this tab only) and shows every refusal's {"error"} in the banner.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  // The console is served at <base>/ui/; the API lives at <base>/ (a proxy may add a prefix).
  const BASE = location.pathname.replace(/\/ui(\/.*)?$/, '');
  const TOKEN_KEY = 'eventbus.console.token';
  const POLL_MS = 2000;
  const TAIL_MAX = 500;
  const CHART_POINTS = 60;

  const state = { me: null, token: sessionStorage.getItem(TOKEN_KEY) || '', page: '', arg: '', gen: 0, timer: 0 };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function authHeaders() {
    return state.token ? { Authorization: 'Bearer ' + state.token } : {};
  }

  /** Calls the broker; a refusal throws an ApiError carrying its {"error"} text. */
  async function api(path, { method = 'GET', body } = {}) {
    const headers = { Accept: 'application/json', ...authHeaders() };
    const init = { method, headers, cache: 'no-store', credentials: 'omit' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(BASE + path, init);
    } catch (err) {
      throw new ApiError(0, `cannot reach the broker (${err.message})`);
    }
    return readJson(response);
  }

  async function readJson(response) {
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const message = data && typeof data.error === 'string' ? data.error : `${response.status} ${response.statusText}`.trim();
      throw new ApiError(response.status, message);
    }
    return data;
  }

  // --- banner ---

  let bannerSource = '';
  let bannerTimer = 0;

  function showBanner(text, { kind = 'error', source = 'action' } = {}) {
    clearTimeout(bannerTimer);
    bannerSource = source;
    $('banner-text').textContent = text;
    $('banner').dataset.kind = kind;
    $('banner').hidden = false;
    if (kind === 'info') bannerTimer = setTimeout(hideBanner, 6000);
  }

  function hideBanner() {
    clearTimeout(bannerTimer);
    bannerSource = '';
    $('banner').hidden = true;
  }

  /** An error from a call: a 401 with authentication on ends the session. */
  function fail(err, source = 'action') {
    if (err instanceof ApiError && err.status === 401 && state.me && state.me.auth) {
      signOut();
      showBanner(`Signed out: ${err.message}`);
      return;
    }
    showBanner(err.message || String(err), { source });
  }

  // --- formatting and DOM ---

  const numberFormat = new Intl.NumberFormat('en');
  const fmtNum = (n) => (typeof n === 'number' ? numberFormat.format(n) : '–');
  const fmtRate = (r) => (r === null ? '–' : r < 10 ? r.toFixed(1) : numberFormat.format(Math.round(r)));

  function fmtTime(iso) {
    if (!iso) return '–';
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? iso : d.toLocaleString(undefined, { hour12: false });
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? '' : value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  const td = (text, attrs = {}) => el('td', { text: String(text), ...attrs });
  const num = (n, field) => el('td', { class: 'num', 'data-field': field, text: fmtNum(n) });

  const rendered = new WeakMap();

  /** Replaces a table's rows, unless what they show has not changed (so a row being
   * clicked is not swapped under the pointer by the next poll). */
  function fill(tbody, rows, render, emptyText, extra = '') {
    const key = JSON.stringify([rows, extra]);
    if (rendered.get(tbody) === key) return;
    rendered.set(tbody, key);
    const columns = tbody.closest('table').querySelectorAll('thead th').length;
    const trs = rows.length ? rows.map(render) : [el('tr', { class: 'empty', 'data-test': 'empty' }, el('td', { colspan: columns, text: emptyText }))];
    tbody.replaceChildren(...trs);
  }

  function globMatch(glob, name) {
    const pattern = glob.split('*').map((piece) => piece.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*');
    return new RegExp(`^${pattern}$`, 's').test(name);
  }

  const mayManage = (name) => (state.me.may_manage || []).some((g) => globMatch(g, name));
  const consumerPath = (name) => '/admin/eventbus/consumers/' + encodeURIComponent(name);

  // --- confirmation dialog ---

  function confirmDialog(title, text, confirmLabel) {
    return new Promise((resolve) => {
      const modal = $('modal');
      $('modal-title').textContent = title;
      $('modal-text').textContent = text;
      $('modal-confirm').textContent = confirmLabel;
      const done = (ok) => {
        modal.hidden = true;
        $('modal-confirm').removeEventListener('click', yes);
        $('modal-cancel').removeEventListener('click', no);
        modal.removeEventListener('click', outside);
        document.removeEventListener('keydown', key);
        resolve(ok);
      };
      const yes = () => done(true);
      const no = () => done(false);
      const outside = (e) => e.target === modal && done(false);
      const key = (e) => e.key === 'Escape' && done(false);
      $('modal-confirm').addEventListener('click', yes);
      $('modal-cancel').addEventListener('click', no);
      modal.addEventListener('click', outside);
      document.addEventListener('keydown', key);
      modal.hidden = false;
      $('modal-cancel').focus();
    });
  }

  /** Runs an action behind the dialog, its button disabled meanwhile. */
  async function confirmed(button, title, text, label, action) {
    if (!(await confirmDialog(title, text, label))) return;
    button.disabled = true;
    try {
      await action();
    } catch (err) {
      fail(err);
    } finally {
      button.disabled = false;
    }
  }

  // --- pages ---

  const overview = { prev: null, rates: [] };

  async function readiness() {
    const response = await fetch(BASE + '/readyz', { headers: authHeaders(), cache: 'no-store' });
    if (response.status === 503) return response.json();
    return readJson(response);
  }

  async function refreshOverview(gen) {
    const [stats, ready, subs] = await Promise.all([
      api('/admin/eventbus/stats'),
      readiness(),
      api('/admin/eventbus/subscriptions'),
    ]);
    if (gen !== state.gen) return;
    const now = performance.now() / 1000;
    const prev = overview.prev;
    const fresh = !prev || prev.stats.started_at !== stats.started_at || stats.total_published < prev.stats.total_published;
    if (fresh) overview.rates = [];
    for (const what of ['published', 'delivered', 'failed', 'dropped']) {
      const field = 'total_' + what;
      $('stat-' + what).textContent = fmtNum(stats[field]);
      const dt = prev ? now - prev.at : 0;
      const rate = !fresh && dt > 0.2 ? Math.max(0, (stats[field] - prev.stats[field]) / dt) : null;
      $('rate-' + what).textContent = fmtRate(rate);
      if (what === 'published' && rate !== null) overview.rates = [...overview.rates, rate].slice(-CHART_POINTS);
    }
    overview.prev = { at: now, stats };
    $('stat-channels').textContent = fmtNum(stats.active_channels);
    $('stat-subscriptions').textContent = fmtNum(stats.active_subscriptions);
    $('stat-mode').textContent = stats.mode;
    $('stat-instance').textContent = stats.instance_id;
    $('stat-started').textContent = fmtTime(stats.started_at);
    const ok = ready.status === 'ready';
    $('health').textContent = ok ? (ready.degraded ? 'degraded' : 'ready') : 'not ready';
    $('health').dataset.state = ok ? (ready.degraded ? 'warn' : 'ok') : 'bad';
    $('health-reason').textContent = ready.reason || ready.degraded || '';
    drawChart(overview.rates);
    fill($('overview-subscriptions'), subs.subscriptions, (s) =>
      el('tr', { 'data-test': 'overview-subscription-row' },
        td(s.name || s.id), td(s.channels.join(' ')), td(s.group || '–'), td(s.owner || '–'),
        num(s.pending), num(s.delivered), num(s.dropped)),
    'No active subscriptions.');
  }

  function drawChart(points) {
    const canvas = $('rate-chart');
    const ctx = canvas.getContext('2d');
    const { width: w, height: h } = canvas;
    canvas.dataset.points = String(points.length);
    ctx.clearRect(0, 0, w, h);
    const style = getComputedStyle(canvas);
    ctx.strokeStyle = style.borderColor;
    ctx.beginPath();
    ctx.moveTo(0, h - 0.5);
    ctx.lineTo(w, h - 0.5);
    ctx.stroke();
    const max = Math.max(1, ...points);
    ctx.fillStyle = style.color;
    ctx.font = '22px system-ui, sans-serif';
    ctx.fillText(`${fmtRate(max)}/s`, 8, 26);
    if (points.length < 2) return;
    const step = w / (CHART_POINTS - 1);
    ctx.strokeStyle = style.color;
    ctx.lineWidth = 3;
    ctx.beginPath();
    points.forEach((v, i) => {
      const x = w - (points.length - 1 - i) * step;
      const y = h - 4 - (v / max) * (h - 40);
      if (i) ctx.lineTo(x, y);
      else ctx.moveTo(x, y);
    });
    ctx.stroke();
    ctx.lineTo(w, h);
    ctx.lineTo(w - (points.length - 1) * step, h);
    ctx.closePath();
    ctx.globalAlpha = 0.12;
    ctx.fillStyle = style.color;
    ctx.fill();
    ctx.globalAlpha = 1;
  }

  async function refreshChannels(gen) {
    const { channels } = await api('/admin/eventbus/channels');
    if (gen !== state.gen) return;
    channels.sort((a, b) => a.channel.localeCompare(b.channel));
    fill($('channels-rows'), channels, (c) =>
      el('tr', { 'data-test': 'channel-row', 'data-channel': c.channel },
        td(c.channel, { class: 'mono' }), num(c.published_count, 'published'), num(c.delivered_count, 'delivered'),
        num(c.subscriber_count, 'subscribers'), td(fmtTime(c.last_published_at)),
        el('td', {}, el('a', { href: '#/tail?channel=' + encodeURIComponent(c.channel), 'data-test': 'channel-tail', text: 'Tail' }))),
    'No channels yet: they appear with their first publish or subscription.');
  }

  async function refreshSubscriptions(gen) {
    const { subscriptions } = await api('/admin/eventbus/subscriptions');
    if (gen !== state.gen) return;
    fill($('subscriptions-rows'), subscriptions, (s) =>
      el('tr', { 'data-test': 'subscription-row', 'data-id': s.id },
        td(s.name || s.id, { title: s.id }), td(s.channels.join(' '), { class: 'mono' }), td(s.group || '–'),
        td(s.owner || '–'), td(s.peer || '–'), el('td', { class: 'num', text: `${fmtNum(s.pending)} / ${fmtNum(s.capacity)}` }),
        num(s.delivered, 'delivered'), num(s.dropped, 'dropped'), td(s.overflow), td(fmtTime(s.created_at))),
    'No active subscriptions.');
  }

  const statePill = (paused) => el('span', { class: 'pill', 'data-state': paused ? 'warn' : 'ok', text: paused ? 'paused' : 'running' });

  async function refreshConsumers(gen) {
    const { consumers } = await api('/admin/eventbus/consumers');
    if (gen !== state.gen) return;
    consumers.sort((a, b) => a.name.localeCompare(b.name));
    fill($('consumers-rows'), consumers, (c) =>
      el('tr', { 'data-test': 'consumer-row', 'data-name': c.name },
        el('td', {}, el('a', { href: '#/consumers/' + encodeURIComponent(c.name), 'data-test': 'consumer-link', text: c.name })),
        td(c.channels.join(' '), { class: 'mono' }), num(c.pending, 'pending'), num(c.in_flight, 'in_flight'),
        num(c.acked, 'acked'), num(c.dead_lettered, 'dead_lettered'), num(c.redrivable, 'redrivable'), num(c.clients, 'clients'),
        el('td', { 'data-field': 'paused' }, statePill(c.paused))),
    'No durable consumers you may read.');
  }

  function showConsumer(c) {
    $('consumer-name').textContent = c.name;
    $('consumer-state').textContent = c.paused ? 'paused' : 'running';
    $('consumer-state').dataset.state = c.paused ? 'warn' : 'ok';
    for (const field of ['pending', 'in_flight', 'acked', 'dead_lettered', 'redrivable', 'redriven']) {
      $('consumer-' + field.replace('_', '-')).textContent = fmtNum(c[field]);
    }
    const manage = mayManage(c.name);
    $('consumer-pause').hidden = !manage || c.paused;
    $('consumer-resume').hidden = !manage || !c.paused;
    $('deadletters-redrive-all').hidden = !manage || !c.redrivable;
    const target = c.push ? `push to ${c.push.url}` : `${fmtNum(c.clients)} attached client(s)`;
    $('consumer-config').textContent = `Channels ${c.channels.join(' ')} · ${target} · max attempts ${c.max_attempts} · ` +
      `ack deadline ${c.ack_deadline_ms} ms · dead letters to ${c.dead_letter_channel || 'dlq.<channel>'} · owner ${c.owner || '–'}`;
  }

  const lastFailure = (failures) => (failures && failures.length ? failures[failures.length - 1].reason : '–');

  async function refreshConsumer(gen, name) {
    const path = consumerPath(name);
    const [c, dead, redriven, pending] = await Promise.all([
      api(path),
      api(path + '/log?status=dead_lettered&limit=100'),
      api(path + '/log?status=redriven&limit=100'),
      api(path + '/pending?limit=100'),
    ]);
    if (gen !== state.gen) return;
    showConsumer(c);
    // A dead letter redriven since it was dead-lettered has nothing left to redrive.
    const redrivenAt = new Map(redriven.entries.map((e) => [e.event_id, Date.parse(e.finished_at)]));
    const rows = dead.entries
      .map((e) => ({ ...e, at: Date.parse(e.finished_at) }))
      .map((e) => ({ ...e, redriven: redrivenAt.get(e.event_id) >= e.at }))
      .sort((a, b) => b.at - a.at);
    const manage = mayManage(name);
    fill($('deadletters-rows'), rows, (e) =>
      el('tr', { 'data-test': 'deadletter-row', 'data-event-id': e.event_id },
        td(e.event_id, { class: 'mono' }), td(e.channel, { class: 'mono' }), num(e.attempts, 'attempts'),
        td(fmtTime(e.finished_at)), td(lastFailure(e.failures), { class: 'wrap' }),
        el('td', {}, e.redriven ? el('span', { class: 'muted', 'data-test': 'redriven', text: 'redriven' })
          : manage ? el('button', { type: 'button', class: 'small', 'data-test': 'redrive', 'data-event-id': e.event_id, text: 'Redrive', onclick: (ev) => redriveOne(ev.currentTarget, name, e.event_id) })
            : null)),
    'No dead letters.', manage);
    fill($('pending-rows'), pending.entries, (p) =>
      el('tr', { 'data-test': 'pending-row', 'data-event-id': p.event.id },
        td(p.event.id, { class: 'mono' }), td(p.event.channel, { class: 'mono' }), td(p.state.replaceAll('_', ' ')),
        num(p.attempt, 'attempt'), td(fmtTime(p.next_delivery)), td(lastFailure(p.failures), { class: 'wrap' })),
    'Nothing pending.');
  }

  function redriveOne(button, name, id) {
    return confirmed(button, 'Redrive dead letter', `Put event ${id} back to consumer “${name}”? It is delivered again with its attempts reset.`, 'Redrive', async () => {
      const done = await api(consumerPath(name) + '/redrive', { method: 'POST', body: { event_ids: [id] } });
      showBanner(done.redriven ? `Redriven ${done.redriven}; ${done.remaining} dead letter(s) remain.` : `Nothing redriven: event ${id} is no longer kept for redrive.`, { kind: 'info' });
      await refreshNow();
    });
  }

  function consumerAction(button, verb) {
    const name = state.arg;
    const text = verb === 'pause'
      ? `Pause consumer “${name}”? It keeps capturing events but delivers none until resumed.`
      : `Resume consumer “${name}”? It delivers again at once.`;
    const label = verb === 'pause' ? 'Pause' : 'Resume';
    return confirmed(button, `${label} consumer`, text, label, async () => {
      const c = await api(`${consumerPath(name)}/${verb}`, { method: 'POST' });
      showConsumer(c);
      showBanner(`Consumer “${name}” ${c.paused ? 'paused' : 'resumed'}.`, { kind: 'info' });
      await refreshNow();
    });
  }

  function redriveAll(button) {
    const name = state.arg;
    return confirmed(button, 'Redrive all dead letters', `Put every dead letter kept for “${name}” back to it (up to 10,000)? They are delivered again with their attempts reset.`, 'Redrive all', async () => {
      const done = await api(consumerPath(name) + '/redrive', { method: 'POST', body: {} });
      showBanner(`Redriven ${done.redriven}; ${done.remaining} dead letter(s) remain.`, { kind: 'info' });
      await refreshNow();
    });
  }

  // --- live tail (EventSource on /v1/subscribe) ---

  const tail = { run: 0, es: null, lastId: '', started: 0, connections: 0, retry: 0, timer: 0, patterns: [], seen: new Set() };

  function tailStatus(text, kind = '') {
    $('tail-status').textContent = text;
    $('tail-status').dataset.state = kind;
  }

  function tailButtons(running) {
    $('tail-start').disabled = running;
    $('tail-stop').disabled = !running;
    $('tail-pattern').disabled = running;
  }

  function tailStart() {
    const patterns = $('tail-pattern').value.split(/[\s,]+/).filter(Boolean);
    if (!patterns.length) {
      showBanner('Enter at least one channel pattern, e.g. orders.> or >');
      return;
    }
    tailStop();
    tail.patterns = patterns;
    tail.lastId = '';
    tail.retry = 0;
    tail.run += 1;
    tailButtons(true);
    tailConnect(tail.run);
  }

  function tailStop(status = 'stopped') {
    tail.run += 1;
    clearTimeout(tail.timer);
    if (tail.es) tail.es.close();
    tail.es = null;
    tailButtons(false);
    tailStatus(status);
  }

  function subscribeUrl(token) {
    const query = new URLSearchParams();
    for (const p of tail.patterns) query.append('channel', p);
    if (token) query.set('token', token);
    if (tail.lastId) query.set('last_event_id', tail.lastId);
    return `${BASE}/v1/subscribe?${query}`;
  }

  async function tailConnect(run) {
    tailStatus('connecting…');
    let token = '';
    if (state.me.auth) {
      try {
        token = (await api('/v1/tokens', { method: 'POST', body: {} })).token;
      } catch (err) {
        if (run !== tail.run) return;
        tailStop('stopped');
        fail(err);
        return;
      }
    }
    if (run !== tail.run) return;
    const es = new EventSource(subscribeUrl(token));
    tail.es = es;
    tail.started = 0;
    es.addEventListener('started', () => {
      tail.started = Date.now();
      tail.connections += 1;
      $('tail-status').dataset.connections = String(tail.connections);
      tailStatus('live', 'ok');
    });
    es.addEventListener('gap', (e) => {
      let reason = 'events published while disconnected are not shown';
      try {
        reason = JSON.parse(e.data).reason || reason;
      } catch {
        // keep the default
      }
      showBanner(`Live tail reconnected with a gap: ${reason}`, { kind: 'info' });
    });
    es.addEventListener('message', (e) => {
      tail.retry = 0;
      if (e.lastEventId) tail.lastId = e.lastEventId;
      try {
        addTailRow(JSON.parse(e.data));
      } catch (err) {
        showBanner(`Unreadable event in the live tail: ${err.message}`);
      }
    });
    es.addEventListener('end', (e) => {
      let reason = '';
      try {
        reason = JSON.parse(e.data).reason || '';
      } catch {
        reason = e.data || '';
      }
      es.close();
      tailRetry(run, `ended by the broker${reason ? ': ' + reason : ''}`);
    });
    es.addEventListener('error', () => {
      es.close();
      if (run !== tail.run) return;
      if (tail.started) tailRetry(run, 'connection lost');
      else tailDiagnose(run);
    });
  }

  /** Reconnects after a pause, with a new token, from the last event shown. */
  function tailRetry(run, why) {
    if (run !== tail.run) return;
    tail.es = null;
    // A stream that lasted (its session token expired, say) reconnects after 1 s; one
    // that keeps failing backs off.
    if (tail.started && Date.now() - tail.started > 10000) tail.retry = 0;
    const delay = Math.min(1000 * 2 ** tail.retry, 15000);
    tail.retry += 1;
    tailStatus(`${why}; reconnecting in ${Math.round(delay / 1000)} s`, 'warn');
    tail.timer = setTimeout(() => run === tail.run && tailConnect(run), delay);
  }

  /** The stream failed before it started: EventSource hides why, so ask the same
   * subscription with fetch (the session's credential in a header) and show the
   * refusal; if it opens, retry. */
  async function tailDiagnose(run) {
    const controller = new AbortController();
    let refusal = null;
    try {
      const response = await fetch(subscribeUrl(''), { headers: authHeaders(), signal: controller.signal, cache: 'no-store' });
      if (!response.ok) {
        try {
          await readJson(response);
        } catch (err) {
          refusal = err;
        }
      }
    } catch (err) {
      if (err.name !== 'AbortError') refusal = new ApiError(0, `cannot reach the broker (${err.message})`);
    } finally {
      controller.abort();
    }
    if (run !== tail.run) return;
    if (refusal && refusal.status !== 0) {
      tailStop('stopped');
      fail(refusal);
    } else {
      tailRetry(run, refusal ? refusal.message : 'could not connect');
    }
  }

  function addTailRow(ev) {
    // A resumed stream starts again from the last event's millisecond: skip repeats.
    if (tail.seen.has(ev.id)) return;
    let payload = '';
    if (typeof ev.payload === 'string') payload = ev.payload;
    else if (ev.payload !== undefined && ev.payload !== null) payload = JSON.stringify(ev.payload);
    else if (ev.payload_base64) payload = `base64 ${ev.payload_base64}`;
    const shown = payload.length > 300 ? payload.slice(0, 300) + '…' : payload;
    const row = el('tr', { 'data-test': 'tail-row', 'data-event-id': ev.id, 'data-channel': ev.channel },
      td(new Date(ev.timestamp).toLocaleTimeString(undefined, { hour12: false }), { title: ev.timestamp }),
      td(ev.channel, { class: 'mono' }), td(ev.id, { class: 'mono small' }), td(ev.source || '–'),
      td(shown, { class: 'mono wrap', 'data-field': 'payload', title: `${ev.content_type || ''}\n${payload.slice(0, 2000)}` }));
    const rows = $('tail-rows');
    if (tail.seen.size === 0) rows.replaceChildren();
    rows.prepend(row);
    tail.seen.add(ev.id);
    while (tail.seen.size > TAIL_MAX) {
      tail.seen.delete(rows.lastElementChild.dataset.eventId);
      rows.lastElementChild.remove();
    }
    $('tail-count').textContent = String(tail.seen.size);
  }

  function tailClear() {
    tail.seen.clear();
    $('tail-rows').replaceChildren();
    $('tail-count').textContent = '0';
  }

  // --- routing, polling, session ---

  const pages = {
    overview: { admin: true, refresh: refreshOverview },
    channels: { admin: true, refresh: refreshChannels },
    subscriptions: { admin: true, refresh: refreshSubscriptions },
    consumers: { refresh: refreshConsumers },
    consumer: { nav: 'consumers', refresh: refreshConsumer },
    tail: {},
  };

  function showPage(name) {
    for (const page of document.querySelectorAll('.page')) page.hidden = page.id !== 'page-' + name;
    const nav = (pages[name] && pages[name].nav) || name;
    for (const link of document.querySelectorAll('#nav a')) link.classList.toggle('active', link.dataset.page === nav);
  }

  function route() {
    if (!state.me) return;
    const [path, query] = location.hash.replace(/^#\/?/, '').split('?');
    let [name, ...rest] = path.split('/');
    let arg = rest.length ? decodeURIComponent(rest.join('/')) : '';
    if (name === 'consumers' && arg) name = 'consumer';
    if (!pages[name] || (pages[name].admin && !state.me.admin)) {
      location.replace('#/' + (state.me.admin ? 'overview' : 'consumers'));
      return;
    }
    if (name === 'tail') {
      const channel = new URLSearchParams(query || '').get('channel');
      if (channel) {
        $('tail-pattern').value = channel;
        tailStart();
      }
    }
    state.page = name;
    state.arg = arg;
    if (name === 'consumer') {
      $('consumer-name').textContent = arg;
      for (const id of ['consumer-pause', 'consumer-resume', 'deadletters-redrive-all']) $(id).hidden = true;
      for (const id of ['deadletters-rows', 'pending-rows']) {
        $(id).replaceChildren();
        rendered.delete($(id));
      }
    }
    showPage(name);
    refreshNow();
  }

  /** Refreshes the page now, then every POLL_MS while it is shown. */
  async function refreshNow() {
    clearTimeout(state.timer);
    const gen = ++state.gen;
    const page = pages[state.page];
    if (!page || !page.refresh || !state.me) return;
    try {
      await page.refresh(gen, state.arg);
      if (gen === state.gen && bannerSource === 'poll') hideBanner();
    } catch (err) {
      if (gen === state.gen) fail(err, 'poll');
    }
    if (gen === state.gen && state.me) state.timer = setTimeout(refreshNow, POLL_MS);
  }

  function showSession() {
    const me = state.me;
    $('nav').hidden = false;
    for (const link of document.querySelectorAll('#nav a[data-admin]')) link.hidden = !me.admin;
    $('whoami').textContent = me.auth ? `${me.principal}${me.admin ? ' · admin' : ''}` : 'authentication off';
    $('logout').hidden = !me.auth;
  }

  function showLogin() {
    state.me = null;
    clearTimeout(state.timer);
    state.gen += 1;
    $('nav').hidden = true;
    $('logout').hidden = true;
    $('whoami').textContent = '';
    showPage('login');
    $('login-token').value = '';
    $('login-token').focus();
  }

  function signOut() {
    tailStop();
    tailClear();
    state.token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    overview.prev = null;
    // The next principal starts on its own first page, not on this one's.
    history.replaceState(null, '', location.pathname + location.search);
    showLogin();
  }

  async function loadSession() {
    try {
      state.me = await api('/v1/whoami');
    } catch (err) {
      state.me = null;
      if (err.status === 401) {
        const had = Boolean(state.token);
        state.token = '';
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin();
        if (had) showBanner(`Sign-in refused: ${err.message}`);
        return;
      }
      showPage('loading');
      showBanner(err.message);
      return;
    }
    hideBanner();
    showSession();
    route();
  }

  function wire() {
    $('banner-close').addEventListener('click', hideBanner);
    $('login-form').addEventListener('submit', (e) => {
      e.preventDefault();
      state.token = $('login-token').value.trim();
      sessionStorage.setItem(TOKEN_KEY, state.token);
      loadSession();
    });
    $('logout').addEventListener('click', () => {
      signOut();
      hideBanner();
    });
    $('consumer-pause').addEventListener('click', (e) => consumerAction(e.currentTarget, 'pause'));
    $('consumer-resume').addEventListener('click', (e) => consumerAction(e.currentTarget, 'resume'));
    $('deadletters-redrive-all').addEventListener('click', (e) => redriveAll(e.currentTarget));
    $('tail-form').addEventListener('submit', (e) => {
      e.preventDefault();
      tailStart();
    });
    $('tail-stop').addEventListener('click', () => tailStop());
    $('tail-clear').addEventListener('click', tailClear);
    window.addEventListener('hashchange', route);
  }

  wire();
  loadSession();
})();
