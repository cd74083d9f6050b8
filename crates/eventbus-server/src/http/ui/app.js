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

  /** A duration for people: 45 s, 12 min, 3.5 h, 2 d. */
  function fmtAge(ms) {
    if (typeof ms !== 'number' || Number.isNaN(ms)) return '–';
    const s = Math.max(0, ms) / 1000;
    if (s < 60) return `${Math.floor(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 48 * 3600) return `${(s / 3600).toFixed(1)} h`;
    return `${Math.floor(s / 86400)} d`;
  }

  /** An event id for a table: its last 8 characters (random in an eventbusd id, so
   * they tell the events of one millisecond apart), the whole id in the tooltip. */
  const shortId = (id) => (typeof id === 'string' && id.length > 12 ? '…' + id.slice(-8) : String(id || '–'));

  /** A source without the ephemeral port of the publisher's connection:
   * 127.0.0.1:53122 → 127.0.0.1, [::1]:53122 → ::1; anything else as given. */
  function sourceHost(source) {
    if (!source) return '–';
    const v4 = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/.exec(source);
    if (v4) return v4[1];
    const v6 = /^\[([0-9A-Fa-f:.]+)\]:\d{1,5}$/.exec(source);
    return v6 ? v6[1] : source;
  }

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
    const [stats, ready, subs, consumers] = await Promise.all([
      api('/admin/eventbus/stats'),
      readiness(),
      api('/admin/eventbus/subscriptions'),
      api('/admin/eventbus/consumers').then((r) => withBacklogAge(r.consumers)),
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
    $('delivery-explained').textContent = `${fmtNum(stats.total_published)} published, ${fmtNum(stats.total_delivered)} delivered: ` +
      'Delivered counts the copies queued to live subscriptions, one per matching subscription (or group) per event. ' +
      'An event published while no subscription matches it is delivered to nobody, and one with three subscribers three times, ' +
      'so the two need not match: that is not a loss. Losses are counted under Failed and Dropped. ' +
      'Durable consumers keep their own copies until acked (below).';
    showBacklog(consumers);
    drawChart(overview.rates);
    fill($('overview-consumers'), consumers, (c) =>
      el('tr', { 'data-test': 'overview-consumer-row', 'data-name': c.name },
        el('td', {}, el('a', { href: '#/consumers/' + encodeURIComponent(c.name), text: c.name })),
        num(c.pending, 'pending'), num(c.in_flight, 'in_flight'), ageCell(c), num(c.clients, 'clients'),
        warnNum(c.redrivable, 'redrivable'), statusCell(c)),
    'No durable consumers.', shownAges(consumers));
    fill($('overview-subscriptions'), subs.subscriptions, (s) =>
      el('tr', { 'data-test': 'overview-subscription-row' },
        td(s.name || s.id), td(s.channels.join(' ')), td(s.group || '–'), td(s.owner || '–'),
        num(s.pending), num(s.delivered), num(s.dropped)),
    'No active subscriptions.');
  }

  const drawChart = (points) => window.eventbusRateChart($('rate-chart'), points, { pollMs: POLL_MS, maxPoints: CHART_POINTS, fmtRate });

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
        num(s.delivered, 'delivered'), num(s.dropped, 'dropped'), td(s.overflow), td(fmtTime(s.created_at)),
        el('td', {}, el('button', { type: 'button', class: 'small ghost', 'data-test': 'subscription-close', 'data-id': s.id, text: 'Close',
          onclick: (ev) => closeSubscription(ev.currentTarget, s) }))),
    'No active subscriptions.');
  }

  function closeSubscription(button, s) {
    const label = s.name ? `“${s.name}” (${s.id})` : s.id;
    const text = `Close subscription ${label} on ${s.channels.join(' ')}${s.peer ? ' from ' + s.peer : ''}? ` +
      'Its stream ends; events queued for it and not yet sent are dropped. A client that reconnects by itself may subscribe again.';
    return confirmed(button, 'Close subscription', text, 'Close', async () => {
      await api('/admin/eventbus/subscriptions/' + encodeURIComponent(s.id), { method: 'DELETE' });
      showBanner(`Subscription ${label} closed.`, { kind: 'info' });
      await refreshNow();
    });
  }

  /** A backlog older than this is shown as a warning. */
  const OLD_BACKLOG_MS = 60000;

  /** Consumers whose backlog age is asked for on each poll (one request each), the
   * largest backlogs first. */
  const MAX_AGES = 50;

  /** Adds `oldest_at` to each consumer holding events: when its oldest unfinished
   * event was published (the first of its pending list, oldest first); null when it
   * holds none, is past MAX_AGES or the list cannot be read. Sorted by name. */
  async function withBacklogAge(consumers) {
    const held = (c) => c.pending + c.in_flight;
    const asked = new Set(consumers.filter(held).sort((a, b) => held(b) - held(a)).slice(0, MAX_AGES));
    const oldest = await Promise.all(consumers.map(async (c) => {
      if (!asked.has(c)) return null;
      try {
        const page = await api(consumerPath(c.name) + '/pending?limit=1');
        const at = page.entries.length ? Date.parse(page.entries[0].event.timestamp) : NaN;
        return Number.isNaN(at) ? null : at;
      } catch {
        return null;
      }
    }));
    return consumers.map((c, i) => ({ ...c, oldest_at: oldest[i] })).sort((a, b) => a.name.localeCompare(b.name));
  }

  /** The age of a consumer's backlog (its oldest unfinished event) now; null without one. */
  const backlogAge = (c) => (typeof c.oldest_at === 'number' ? Math.max(0, Date.now() - c.oldest_at) : null);

  /** The ages a consumer table shows: it is drawn again when one of them reads otherwise. */
  const shownAges = (consumers) => consumers.map((c) => fmtAge(backlogAge(c) ?? NaN));

  /** What an operator should look at on a consumer, worst first; none when all is well. */
  function consumerWarnings(c) {
    const warnings = [];
    const held = c.pending + c.in_flight;
    if (c.paused) warnings.push({ key: 'paused', text: 'paused' });
    if (!c.push && !c.clients && held) warnings.push({ key: 'no-client', text: `${fmtNum(held)} pending, no client attached` });
    if (c.redrivable) warnings.push({ key: 'dead-letters', text: `${fmtNum(c.redrivable)} dead letter${c.redrivable === 1 ? '' : 's'}` });
    const age = backlogAge(c);
    if (age !== null && age >= OLD_BACKLOG_MS) warnings.push({ key: 'old-backlog', text: `backlog ${fmtAge(age)} old` });
    if (c.dropped) warnings.push({ key: 'dropped', text: `${fmtNum(c.dropped)} not captured (max pending)` });
    return warnings;
  }

  const pill = (text, kind, key) => el('span', { class: 'pill', 'data-state': kind, 'data-warning': key, text });

  /** The status: one green "running" pill, or a warning pill per problem. */
  function statusPills(c) {
    const warnings = consumerWarnings(c);
    return warnings.length ? warnings.map((w) => pill(w.text, 'warn', w.key)) : [pill('running', 'ok')];
  }

  const statusCell = (c) => el('td', { 'data-field': 'status', class: 'pills-cell' }, el('span', { class: 'pills' }, ...statusPills(c)));
  function ageCell(c) {
    const age = backlogAge(c);
    return el('td', { class: 'num', 'data-field': 'oldest', 'data-state': age !== null && age >= OLD_BACKLOG_MS ? 'warn' : null,
      title: age === null ? null : `oldest unfinished event published ${fmtTime(new Date(c.oldest_at).toISOString())}`,
      text: age === null ? '–' : fmtAge(age) });
  }
  const warnNum = (n, field) => el('td', { class: 'num', 'data-field': field, 'data-state': n ? 'warn' : null, text: fmtNum(n) });

  /** The overview's durable backlog: events held by every consumer, and who lacks a client. */
  function showBacklog(consumers) {
    const held = consumers.reduce((sum, c) => sum + c.pending + c.in_flight, 0);
    const unattended = consumers.filter((c) => !c.push && !c.clients && c.pending + c.in_flight);
    const dead = consumers.reduce((sum, c) => sum + c.redrivable, 0);
    const oldest = Math.max(-1, ...consumers.map((c) => backlogAge(c) ?? -1));
    $('stat-backlog').textContent = fmtNum(held);
    $('stat-backlog').dataset.state = unattended.length || dead ? 'warn' : '';
    const parts = [`${fmtNum(consumers.length)} consumer${consumers.length === 1 ? '' : 's'}`];
    if (oldest >= 0) parts.push(`oldest ${fmtAge(oldest)}`);
    if (unattended.length) parts.push(`${unattended.length} with no client attached`);
    if (dead) parts.push(`${fmtNum(dead)} dead letter${dead === 1 ? '' : 's'}`);
    $('stat-backlog-detail').textContent = parts.join(' · ');
  }

  async function refreshConsumers(gen) {
    const consumers = await api('/admin/eventbus/consumers').then((r) => withBacklogAge(r.consumers));
    if (gen !== state.gen) return;
    fill($('consumers-rows'), consumers, (c) =>
      el('tr', { 'data-test': 'consumer-row', 'data-name': c.name },
        el('td', {}, el('a', { href: '#/consumers/' + encodeURIComponent(c.name), 'data-test': 'consumer-link', text: c.name })),
        td(c.channels.join(' '), { class: 'mono' }), num(c.pending, 'pending'), num(c.in_flight, 'in_flight'), ageCell(c),
        num(c.acked, 'acked'), num(c.dead_lettered, 'dead_lettered'), warnNum(c.redrivable, 'redrivable'), num(c.clients, 'clients'),
        statusCell(c)),
    'No durable consumers you may read.', shownAges(consumers));
  }

  function showConsumer(c) {
    $('consumer-name').textContent = c.name;
    $('consumer-state').textContent = c.paused ? 'paused' : 'running';
    $('consumer-state').dataset.state = c.paused ? 'warn' : 'ok';
    const warnings = consumerWarnings(c).filter((w) => w.key !== 'paused');
    $('consumer-warnings').replaceChildren(...warnings.map((w) => pill(w.text, 'warn', w.key)));
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
      td(ev.channel, { class: 'mono' }), td(shortId(ev.id), { class: 'mono small', title: ev.id, 'data-field': 'id' }),
      td(sourceHost(ev.source), { title: ev.source || '', 'data-field': 'source' }),
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
