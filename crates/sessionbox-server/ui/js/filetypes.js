// What a file name says about how to preview it. Pure, so the unit tests run it in Node.

// Raster formats only. An SVG is a document that can hold script: a blob: URL of one, opened
// in a tab of its own, would run it in the dashboard's origin. SVG previews as XML text.
const IMAGE_TYPES = {
  png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif', webp: 'image/webp',
  avif: 'image/avif', bmp: 'image/bmp', ico: 'image/x-icon',
};

// Only languages vendored under vendor/highlight/languages/ (see ui-src/vendor.mjs).
const LANGUAGE_BY_EXTENSION = {
  sh: 'bash', bash: 'bash', zsh: 'bash', c: 'c', h: 'c', cc: 'cpp', cpp: 'cpp', cxx: 'cpp',
  hpp: 'cpp', hh: 'cpp', css: 'css', diff: 'diff', patch: 'diff', go: 'go', ini: 'ini',
  toml: 'ini', cfg: 'ini', conf: 'ini', java: 'java', js: 'javascript', mjs: 'javascript',
  cjs: 'javascript', jsx: 'javascript', json: 'json', jsonl: 'json', md: 'markdown',
  markdown: 'markdown', mk: 'makefile', py: 'python', pyi: 'python', rs: 'rust', sql: 'sql',
  ts: 'typescript', tsx: 'typescript', mts: 'typescript', cts: 'typescript', html: 'xml',
  htm: 'xml', xml: 'xml', svg: 'xml', yml: 'yaml', yaml: 'yaml',
};

const LANGUAGE_BY_NAME = {
  makefile: 'makefile', gnumakefile: 'makefile', dockerfile: 'dockerfile',
  containerfile: 'dockerfile', 'cargo.lock': 'ini', '.bashrc': 'bash', '.profile': 'bash',
};

export const LANGUAGES = [...new Set([...Object.values(LANGUAGE_BY_EXTENSION), ...Object.values(LANGUAGE_BY_NAME)])];

export function baseName(path) {
  const parts = path.split('/').filter(Boolean);
  return parts.length ? parts[parts.length - 1] : '';
}

function extension(name) {
  const dot = name.lastIndexOf('.');
  return dot > 0 ? name.slice(dot + 1).toLowerCase() : '';
}

/** 'image/png' for an image the browser can show, else null. */
export function imageType(path) {
  return IMAGE_TYPES[extension(baseName(path))] ?? null;
}

/** The highlight.js language of a file, or null (plain text). */
export function languageOf(path) {
  const name = baseName(path).toLowerCase();
  return LANGUAGE_BY_NAME[name] ?? LANGUAGE_BY_EXTENSION[extension(name)] ?? null;
}

/**
 * The bytes as text, or null when they look binary (a NUL, or not UTF-8). `cut` says the
 * bytes stop before the file does, so a character cut in two at the end is not an error.
 */
export function asText(bytes, cut = false) {
  const head = bytes.subarray(0, 8192);
  if (head.includes(0)) return null;
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes, { stream: cut });
  } catch {
    return null;
  }
}

/** 'a/b' + 'c' → 'a/b/c'; '' + 'c' → 'c'. */
export function joinPath(dir, name) {
  return [...dir.split('/'), ...name.split('/')].filter(Boolean).join('/');
}
