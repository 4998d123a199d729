// Hash routes → what to show. Pure, so the unit tests run it in Node.

export const TABS = [
  { id: 'files', label: 'Files' },
  { id: 'terminal', label: 'Terminal' },
  { id: 'commands', label: 'Commands' },
  { id: 'network', label: 'Network' },
  { id: 'audit', label: 'Audit' },
  { id: 'snapshots', label: 'Snapshots' },
];

function decode(segment) {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

/** '#/c/abc/files/src/lib' → {name: 'conversation', id: 'abc', tab: 'files', path: 'src/lib'} */
export function parseRoute(hash) {
  const seg = hash.replace(/^#/, '').split('/').filter(Boolean).map(decode);
  if (seg.length === 0) return { name: 'conversations' };
  if (seg[0] === 'installation' && seg.length === 1) return { name: 'installation' };
  if (seg[0] === 'c' && seg.length >= 2) {
    const tab = seg[2] || 'files';
    if (!TABS.some((t) => t.id === tab)) return { name: 'missing' };
    if (tab !== 'files' && seg.length > 3) return { name: 'missing' };
    return { name: 'conversation', id: seg[1], tab, path: tab === 'files' ? seg.slice(3).join('/') : '' };
  }
  return { name: 'missing' };
}

/** The hash of a conversation's tab (and directory, for files). */
export function hashOf(id, tab = 'files', path = '') {
  let hash = `#/c/${encodeURIComponent(id)}`;
  if (tab !== 'files' || path) hash += `/${tab}`;
  if (tab === 'files' && path) {
    hash += '/' + path.split('/').filter(Boolean).map(encodeURIComponent).join('/');
  }
  return hash;
}
