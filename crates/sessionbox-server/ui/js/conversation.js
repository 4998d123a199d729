// One conversation: its facts (polled) and tabs for files, terminal, commands, network, audit
// and snapshots. Tabs are links (#/c/{id}/{tab}); a panel is made on its first visit and kept
// while the conversation stays open, so a terminal survives a look at the files.

import { ApiError, conv, getJson, postJson } from './api.js';
import { destroyConversation } from './dialogs.js';
import { diskCell, memoryCell, stateBadge } from './conversations.js';
import { facts, fmtTime, h, inlineError, poll, showError, timeEl } from './dom.js';
import { TABS, hashOf } from './route.js';
import { createFilesPanel } from './files.js';
import { createTerminalPanel } from './terminal.js';
import { createCommandsPanel } from './commands.js';
import { createNetworkPanel, createAuditPanel, createSnapshotsPanel } from './records.js';

const FACTS_EVERY_MS = 10_000;

const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

const FACTORIES = {
  files: createFilesPanel,
  terminal: createTerminalPanel,
  commands: createCommandsPanel,
  network: createNetworkPanel,
  audit: createAuditPanel,
  snapshots: createSnapshotsPanel,
};

export class ConversationView {
  constructor(main, id, session) {
    this.id = id;
    this.session = session;
    this.panels = new Map();
    this.active = null;

    this.factsBox = h('div', { class: 'conv-facts', 'aria-label': 'Facts', role: 'group' }, h('p', { class: 'muted', text: 'Loading…' }));
    this.note = h('div', { class: 'problem' });
    this.tabLinks = new Map();
    const tabs = h('nav', { class: 'tabs', 'aria-label': 'Conversation sections' },
      h('ul', {}, TABS.map((t) => {
        const a = h('a', { href: hashOf(id, t.id), id: `tab-${t.id}`, text: t.label });
        this.tabLinks.set(t.id, a);
        return h('li', {}, a);
      })));
    this.panelBox = h('div', { class: 'panels' });
    const destroy = h('button', {
      type: 'button', class: 'danger', text: 'Destroy…',
      onclick: async () => {
        if (await destroyConversation(id)) location.hash = '#/';
      },
    });
    main.append(
      h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' },
        h('ol', {}, h('li', {}, h('a', { href: '#/', text: 'Conversations' })),
          h('li', {}, h('span', { 'aria-current': 'page', text: id })))),
      h('div', { class: 'title-row' },
        h('h1', {}, 'Conversation ', h('code', { text: id })),
        destroy),
      this.factsBox, this.note, tabs, this.panelBox);

    // Panels wait for the first answer: opening the files or a terminal of a conversation
    // that does not exist would create it, so that takes a click.
    this.exists = null;
    let firstDone;
    this.first = new Promise((resolve) => { firstDone = resolve; });
    this.stopFacts = poll(async () => {
      const found = await this.loadFacts();
      const before = this.exists;
      this.exists = found || this.exists === true;
      firstDone();
      if (before === false && this.exists && this.route) this.mount(this.route);
    }, FACTS_EVERY_MS);
  }

  /** Shows the facts; false when the conversation does not exist. */
  async loadFacts() {
    let c;
    try {
      c = await getJson(conv(this.id));
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        this.factsBox.replaceChildren(h('p', { class: 'error-box', text: `There is no conversation ${this.id} (it may have been destroyed): ${error.message}` }));
        return false;
      }
      this.factsBox.replaceChildren(inlineError(error, 'Could not load the conversation'));
      return true;
    }
    const usage = c.usage
      ? `${plural(c.usage.operations, 'operation')}, ${plural(c.usage.execs, 'command')}`
      : '—';
    this.factsBox.replaceChildren(facts([
      ['State', stateBadge(c.state)],
      ['Runtime', c.runtime],
      ['Created', h('time', { datetime: c.created_at, text: fmtTime(c.created_at) })],
      ['Last used', timeEl(c.last_used_at)],
      ['Expires', c.expires_at ? timeEl(c.expires_at) : 'never'],
      ['Disk', diskCell(c.disk, c.runtime)],
      ['Memory', memoryCell(c.memory, c.runtime)],
      ['Usage', usage],
    ]));
    this.note.replaceChildren(c.state === 'expired'
      ? h('p', { class: 'warn-box', text: 'This conversation has expired: its files are gone at its next use, which starts a new, empty one.' })
      : '');
    return true;
  }

  /** Shows the route's tab (and directory), once it is known that the conversation exists. */
  show(route) {
    this.route = route;
    const tab = route.tab || 'files';
    for (const [name, a] of this.tabLinks) {
      if (name === tab) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    this.first.then(() => {
      if (this.route === route) this.mount(route);
    });
  }

  mount(route) {
    if (this.disposed) return;
    if (this.exists === false) {
      this.panelBox.replaceChildren(h('div', { class: 'unavailable' },
        h('p', { text: 'Its files, terminal and commands would make a new, empty conversation with this id.' }),
        h('p', {},
          h('button', { type: 'button', class: 'secondary', onclick: () => this.create(), text: 'Create it' }),
          ' or ', h('a', { href: '#/', text: 'go back to the conversations' }))));
      return;
    }
    const tab = route.tab || 'files';
    let panel = this.panels.get(tab);
    if (!panel) {
      if (!this.panels.size) this.panelBox.replaceChildren();
      panel = FACTORIES[tab](this.id);
      this.panels.set(tab, panel);
      this.panelBox.append(panel.el);
    }
    const changed = this.active !== tab;
    if (changed && this.active) {
      const old = this.panels.get(this.active);
      old.el.hidden = true;
      old.hide?.();
    }
    this.active = tab;
    panel.el.hidden = false;
    panel.show(route);
    if (changed && this.shownOnce) panel.el.querySelector('h2')?.focus();
    this.shownOnce = true;
  }

  async create() {
    try {
      await postJson(conv(this.id), {});
    } catch (error) {
      showError(error, `Could not create ${this.id}`);
      return;
    }
    this.exists = true;
    await this.loadFacts();
    this.mount(this.route);
  }

  dispose() {
    this.disposed = true;
    this.stopFacts();
    for (const panel of this.panels.values()) panel.dispose();
  }
}
