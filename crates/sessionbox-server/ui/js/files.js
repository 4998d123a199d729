// A conversation's files: breadcrumb and directory listing (ls), a preview (text with syntax
// highlighting, images through blob: URLs), download, and upload by drag and drop or a file
// input.

import { conv, getJson, pathSegments, query, request } from './api.js';
import { announce, dataTable, fmtBytes, h, inlineError, row, syncRows } from './dom.js';
import { asText, baseName, imageType, joinPath, languageOf } from './filetypes.js';
import { hashOf } from './route.js';

const PREVIEW_BYTES = 1024 * 1024;
const HIGHLIGHT_MAX_CHARS = 300_000;

let highlighter = null;
async function highlight(language) {
  highlighter ??= import('../vendor/highlight/core.min.js').then((m) => m.default);
  const hljs = await highlighter;
  if (!hljs.getLanguage(language)) {
    const grammar = await import(`../vendor/highlight/languages/${language}.min.js`);
    hljs.registerLanguage(language, grammar.default);
  }
  return hljs;
}

/** Fetches a file with the key and saves it through a temporary blob: link. */
export async function downloadFile(id, path) {
  const response = await request(`${conv(id, `/files/${pathSegments(path)}`)}?download=1`);
  // Bytes only: whatever the file is, the blob is never a document the browser would render.
  const blob = new Blob([await response.arrayBuffer()], { type: 'application/octet-stream' });
  const url = URL.createObjectURL(blob);
  // The name is the workspace's: no control or bidirectional characters (a name such as
  // "invoice\u202Efdp.exe" would pass for a PDF).
  const name = baseName(path).replace(/[\u0000-\u001f\u007f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g, '_');
  const a = h('a', { href: url, download: name, class: 'visually-hidden' });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

const COLUMNS = ['Name', 'Size', 'Modified', 'Actions'];

export function createFilesPanel(id) {
  const headingId = `files-title-${id}`;
  const crumbs = h('nav', { class: 'crumbs', 'aria-label': 'Folder' }, h('ol'));
  const refresh = h('button', { type: 'button', class: 'secondary', text: 'Refresh' });
  const fileInput = h('input', { type: 'file', id: `upload-input-${id}`, multiple: true });
  const uploadStatus = h('p', { class: 'muted upload-status', role: 'status' });
  const where = h('code');
  const dropZone = h('div', { class: 'drop-zone', id: `drop-zone-${id}` },
    h('p', {}, 'Drop files here to upload them into ', where, ', or '),
    h('div', { class: 'field inline' },
      h('label', { for: `upload-input-${id}`, text: 'choose files to upload' }), fileInput),
    uploadStatus);
  const problem = h('div', { class: 'problem' });
  const { wrap, tbody } = dataTable('Files in this folder', COLUMNS.map((label) => ({ label })), { cls: 'files cards' });
  const empty = h('p', { class: 'empty', hidden: true, text: 'This folder is empty.' });
  const preview = h('section', { class: 'preview', hidden: true, 'aria-labelledby': `preview-title-${id}` });

  const listing = h('div', { class: 'listing' }, problem, wrap, empty, dropZone);
  const el = h('section', { class: 'panel files-panel', 'aria-labelledby': headingId },
    h('div', { class: 'panel-head' }, h('h2', { id: headingId, tabindex: '-1', text: 'Files' }), refresh),
    crumbs,
    h('div', { class: 'files-layout' }, listing, preview));

  let dir = null;
  let loadController = null;
  let previewController = null;
  let previewUrl = null;
  let fresh = new Set();

  const renderCrumbs = () => {
    const parts = dir.split('/').filter(Boolean);
    const items = [h('li', {}, parts.length
      ? h('a', { href: hashOf(id, 'files', ''), text: 'workspace' })
      : h('span', { 'aria-current': 'page', text: 'workspace' }))];
    parts.forEach((part, i) => {
      const path = parts.slice(0, i + 1).join('/');
      items.push(h('li', {}, i === parts.length - 1
        ? h('span', { 'aria-current': 'page', text: part })
        : h('a', { href: hashOf(id, 'files', path), text: part })));
    });
    crumbs.firstElementChild.replaceChildren(...items);
    where.textContent = `/${dir}`;
  };

  const makeRow = (entry) => {
    const path = joinPath(dir, entry.name);
    const isDir = entry.kind === 'directory';
    const name = isDir
      ? h('a', { href: hashOf(id, 'files', path), class: 'entry dir' }, `${entry.name}/`)
      : h('button', { type: 'button', class: 'link entry', 'aria-label': `Preview ${entry.name}`, onclick: () => openPreview(path, entry) },
        entry.name, entry.kind === 'symlink' ? h('span', { class: 'muted', text: ' (link)' }) : null);
    const actions = isDir ? h('span', { class: 'muted', text: '—' })
      : h('button', {
        type: 'button', class: 'secondary small', text: 'Download', 'aria-label': `Download ${entry.name}`,
        onclick: () => downloadFile(id, path).catch((e) => problem.replaceChildren(inlineError(e, `Could not download ${entry.name}`))),
      });
    const modified = entry.modified_unix
      ? h('time', { datetime: new Date(entry.modified_unix * 1000).toISOString(), text: new Date(entry.modified_unix * 1000).toLocaleString() })
      : '—';
    return row(COLUMNS, [name, isDir ? h('span', { class: 'muted', text: '—' }) : fmtBytes(entry.size), modified, actions]);
  };

  const load = async () => {
    loadController?.abort();
    loadController = new AbortController();
    const target = dir;
    try {
      const answer = await getJson(`${conv(id, '/ls')}${query({ path: target || null })}`, { signal: loadController.signal });
      if (target !== dir) return;
      problem.replaceChildren();
      const entries = answer.entries.slice().sort((a, b) =>
        (b.kind === 'directory') - (a.kind === 'directory') || a.name.localeCompare(b.name));
      // A row is rebuilt when the entry changed (size, time, kind).
      syncRows(tbody, entries, (e) => `${e.kind}:${e.name}:${e.size}:${e.modified_unix}`, makeRow, (tr, e) => {
        tr.classList.toggle('fresh', fresh.has(e.name));
      });
      wrap.hidden = entries.length === 0;
      empty.hidden = entries.length !== 0;
    } catch (error) {
      if (error.name === 'AbortError') return;
      tbody.replaceChildren();
      wrap.hidden = true;
      empty.hidden = true;
      problem.replaceChildren(inlineError(error, dir ? `Could not list /${dir}` : 'Could not list the workspace'));
    }
  };

  const closePreview = () => {
    previewController?.abort();
    if (previewUrl) URL.revokeObjectURL(previewUrl);
    previewUrl = null;
    preview.hidden = true;
    preview.replaceChildren();
  };

  const openPreview = async (path, entry) => {
    closePreview();
    previewController = new AbortController();
    const { signal } = previewController;
    const name = baseName(path);
    const title = h('h3', { id: `preview-title-${id}`, tabindex: '-1' }, h('code', { text: `/${path}` }));
    const body = h('div', { class: 'preview-body', 'aria-busy': 'true' }, h('p', { class: 'muted', text: 'Loading…' }));
    const closeButton = h('button', {
      type: 'button', class: 'secondary small', text: 'Close preview',
      onclick: () => {
        closePreview();
        tbody.querySelector(`button[aria-label="Preview ${CSS.escape(entry.name)}"]`)?.focus();
      },
    });
    const download = h('button', {
      type: 'button', class: 'secondary small', text: 'Download',
      onclick: () => downloadFile(id, path).catch((e) => body.prepend(inlineError(e, 'Could not download'))),
    });
    preview.replaceChildren(h('div', { class: 'preview-head' }, title, h('div', { class: 'buttons' }, download, closeButton)), body);
    preview.hidden = false;
    title.focus();
    try {
      const image = imageType(path);
      const cut = !image && entry.size > PREVIEW_BYTES;
      const response = await request(conv(id, `/files/${pathSegments(path)}`), {
        signal,
        headers: cut ? { Range: `bytes=0-${PREVIEW_BYTES - 1}` } : {},
      });
      const bytes = new Uint8Array(await response.arrayBuffer());
      if (signal.aborted) return;
      if (image) {
        previewUrl = URL.createObjectURL(new Blob([bytes], { type: image }));
        const img = h('img', { src: previewUrl, alt: `Preview of ${name}` });
        img.addEventListener('error', () => body.replaceChildren(h('p', { class: 'error-box', text: 'The browser could not show this image.' })));
        body.replaceChildren(img, h('p', { class: 'muted', text: fmtBytes(bytes.length) }));
        return;
      }
      const text = asText(bytes, cut || response.status === 206);
      if (text === null) {
        body.replaceChildren(h('p', {}, `Binary file, ${fmtBytes(entry.size)}: no preview. Download it to see it.`));
        return;
      }
      const language = languageOf(path);
      const code = h('code', { class: language ? `hljs language-${language}` : 'plain' });
      const pre = h('pre', { class: 'code', tabindex: '0', 'aria-label': `Contents of ${name}` }, code);
      if (language && text.length <= HIGHLIGHT_MAX_CHARS) {
        const hljs = await highlight(language);
        if (signal.aborted) return;
        // highlight.js escapes the text; its markup is spans with classes only.
        code.innerHTML = hljs.highlight(text, { language, ignoreIllegals: true }).value;
      } else {
        code.textContent = text;
      }
      const notes = [];
      if (cut) notes.push(h('p', { class: 'muted', text: `The first ${fmtBytes(PREVIEW_BYTES)} of ${fmtBytes(entry.size)} shown.` }));
      notes.push(h('p', { class: 'muted', text: language ? `${language} · ${fmtBytes(entry.size)}` : `text · ${fmtBytes(entry.size)}` }));
      body.replaceChildren(pre, ...notes);
    } catch (error) {
      if (error.name === 'AbortError') return;
      body.replaceChildren(inlineError(error, 'Could not open the file'));
    } finally {
      body.removeAttribute('aria-busy');
    }
  };

  const upload = async (files) => {
    if (!files.length) return;
    const target = dir;
    const form = new FormData();
    for (const file of files) {
      form.append('path', joinPath(target, file.name));
      form.append('file', file, file.name);
    }
    uploadStatus.textContent = `Uploading ${files.length === 1 ? files[0].name : `${files.length} files`}…`;
    try {
      const response = await request(conv(id, '/files'), { method: 'POST', body: form });
      const answer = await response.json();
      const total = answer.files.reduce((n, f) => n + f.bytes, 0);
      const message = `Uploaded ${answer.files.map((f) => f.path).join(', ')} (${fmtBytes(total)})`;
      uploadStatus.textContent = message;
      announce(message);
      fresh = new Set(files.map((f) => f.name));
      if (target === dir) await load();
    } catch (error) {
      uploadStatus.textContent = '';
      const box = inlineError(error, 'Upload failed');
      problem.replaceChildren(box);
      announce(box.textContent);
    }
  };

  fileInput.addEventListener('change', () => {
    const files = [...fileInput.files];
    fileInput.value = '';
    upload(files);
  });

  // Drops anywhere over the listing go to the folder shown.
  let depth = 0;
  listing.addEventListener('dragenter', (e) => {
    e.preventDefault();
    depth += 1;
    listing.classList.add('dragging');
  });
  listing.addEventListener('dragleave', () => {
    depth = Math.max(0, depth - 1);
    if (depth === 0) listing.classList.remove('dragging');
  });
  listing.addEventListener('dragover', (e) => {
    e.preventDefault();
    if (e.dataTransfer) e.dataTransfer.dropEffect = 'copy';
  });
  listing.addEventListener('drop', (e) => {
    e.preventDefault();
    depth = 0;
    listing.classList.remove('dragging');
    const items = [...(e.dataTransfer?.items || [])];
    const folders = items.filter((item) => item.webkitGetAsEntry?.()?.isDirectory).length;
    const files = [...(e.dataTransfer?.files || [])].filter((f, i) => !items[i]?.webkitGetAsEntry?.()?.isDirectory);
    if (folders) problem.replaceChildren(h('p', { class: 'warn-box', text: 'Folders are not uploaded: drop the files in them instead.' }));
    upload(files);
  });
  // A drop that misses the zone must not make the browser leave the page for the file.
  const swallow = (e) => {
    if (!el.hidden && el.isConnected) e.preventDefault();
  };
  window.addEventListener('dragover', swallow);
  window.addEventListener('drop', swallow);

  refresh.addEventListener('click', () => load());

  return {
    el,
    show(route) {
      const next = route.path || '';
      if (next !== dir) {
        dir = next;
        fresh = new Set();
        uploadStatus.textContent = '';
        closePreview();
        renderCrumbs();
        tbody.replaceChildren();
        load();
      }
    },
    hide() {},
    dispose() {
      loadController?.abort();
      closePreview();
      window.removeEventListener('dragover', swallow);
      window.removeEventListener('drop', swallow);
    },
  };
}

