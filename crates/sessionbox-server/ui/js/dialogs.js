// A confirmation in a modal <dialog> (focus stays inside it; Escape cancels; focus goes back
// to where it was).

import { conv, request } from './api.js';
import { announce, h, showError } from './dom.js';

export function confirmDialog({ title, body, confirm, danger = true }) {
  return new Promise((resolve) => {
    const opener = document.activeElement;
    const titleId = `dialog-title-${Date.now()}`;
    const cancelButton = h('button', { type: 'button', class: 'secondary', text: 'Cancel' });
    const okButton = h('button', { type: 'button', class: danger ? 'danger' : '', text: confirm });
    const dialog = h('dialog', { class: 'confirm', 'aria-labelledby': titleId },
      h('h2', { id: titleId, text: title }),
      body.map((text) => h('p', {}, text)),
      h('div', { class: 'dialog-actions' }, cancelButton, okButton));
    let answer = false;
    const close = (value) => {
      answer = value;
      dialog.close();
    };
    cancelButton.addEventListener('click', () => close(false));
    okButton.addEventListener('click', () => close(true));
    dialog.addEventListener('close', () => {
      dialog.remove();
      if (opener && opener.isConnected) opener.focus();
      resolve(answer);
    });
    document.body.append(dialog);
    dialog.showModal();
    cancelButton.focus();
  });
}

/** Asks, then destroys the conversation. Resolves true when it was destroyed. */
export async function destroyConversation(id) {
  const yes = await confirmDialog({
    title: `Destroy conversation ${id}?`,
    body: [
      'This kills its processes and removes its workspace and record. Its files cannot be recovered (snapshots are kept).',
    ],
    confirm: 'Destroy',
  });
  if (!yes) return false;
  try {
    await request(conv(id), { method: 'DELETE' });
  } catch (error) {
    showError(error, `Could not destroy ${id}`);
    return false;
  }
  announce(`Conversation ${id} destroyed`);
  return true;
}
