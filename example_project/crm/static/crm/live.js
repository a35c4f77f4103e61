// The live page: the contacts of a workspace, kept current by realtime events.
import { RealtimeClient } from "/static/realtime/realtime.js";

const state = {
  scope: JSON.parse(document.getElementById("realtime-scope").textContent),
  openContact: null,
};

const client = new RealtimeClient({
  url: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/ws`,
  token: JSON.parse(document.getElementById("realtime-token").textContent),
  scope: state.scope,
  refreshToken: async () => (await getJson("/realtime/token")).token,
});

async function getJson(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return response.json();
}

function escapeHtml(text) {
  const div = document.createElement("div");
  div.textContent = text ?? "";
  return div.innerHTML;
}

async function refreshContacts() {
  const { contacts } = await getJson(`/api/w/${state.scope}/contacts`);
  document.querySelector("#contacts tbody").innerHTML = contacts
    .map(
      (c) =>
        `<tr data-id="${c.id}"><td class="name">${escapeHtml(c.name)}</td>` +
        `<td>${escapeHtml(c.email)}</td><td>${escapeHtml(c.company)}</td></tr>`,
    )
    .join("");
}

async function showContact(id) {
  if (state.openContact && state.openContact !== id) client.unsubscribe(`contact:${state.openContact}`);
  state.openContact = id;
  client.subscribe(`contact:${id}`);
  const detail = document.getElementById("detail");
  try {
    const contact = await getJson(`/api/contacts/${id}`);
    detail.hidden = false;
    document.getElementById("detail-name").textContent = contact.name;
    document.getElementById("detail-email").textContent = contact.email;
    document.getElementById("detail-company").textContent = contact.company;
    document.getElementById("detail-notes").textContent = contact.notes_text;
    document.getElementById("detail-private-notes").innerHTML = contact.private_notes
      .map((note) => `<li data-note="${note.id}">${escapeHtml(note.text)}</li>`)
      .join("");
    document.getElementById("detail-status").textContent = "";
  } catch {
    document.getElementById("detail-status").textContent = "This contact was deleted.";
  }
}

function toast(text) {
  const item = document.createElement("div");
  item.className = "toast";
  item.textContent = text;
  document.getElementById("toasts").append(item);
  setTimeout(() => item.remove(), 5000);
}

// The list: any contact event of the workspace re-reads it (the server is the truth).
for (const type of ["contact.created", "contact.updated", "contact.deleted"]) {
  client.addEventListener(type, (event) => {
    refreshContacts();
    const id = event.detail.data?.id;
    if (event.detail.moved && type === "contact.deleted") toast("A contact moved to another workspace");
    if (id && id === state.openContact) {
      if (type === "contact.deleted") {
        document.getElementById("detail-status").textContent = "This contact was deleted.";
      } else {
        showContact(id);
      }
    }
  });
}
// Private notes reach their author only; they travel on the contact's channel.
for (const type of ["private_note.created", "private_note.updated", "private_note.deleted"]) {
  client.addEventListener(type, () => state.openContact && showContact(state.openContact));
}
client.addEventListener("notification.created", (event) => toast(event.detail.data?.text ?? "New notification"));

client.addEventListener("state", (event) => {
  const badge = document.getElementById("connection");
  const { state: value, reason, resumed } = event.detail;
  badge.dataset.state = value;
  badge.textContent = reason ? `${value}: ${reason}` : value;
  // What the page shows was read before the socket opened: unless the frames missed since
  // follow (resumed), read it again, or a write committed in between stays unseen.
  if (value === "open" && !resumed) {
    refreshContacts();
    if (state.openContact) showContact(state.openContact);
  }
});

document.querySelector("#contacts tbody").addEventListener("click", (event) => {
  const row = event.target.closest("tr[data-id]");
  if (row) showContact(Number(row.dataset.id));
});

// Moving a contact: this page drops it (it hears contact.deleted, "moved"), the pages of the
// other workspace show it (they hear contact.created).
document.getElementById("move-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!state.openContact) return;
  const form = new FormData(event.target);
  const response = await fetch(`/api/contacts/${state.openContact}/move`, {
    method: "POST",
    body: form,
    credentials: "same-origin",
    headers: { "X-CSRFToken": form.get("csrfmiddlewaretoken") },
  });
  if (response.ok) document.getElementById("detail").hidden = true;
});

document.getElementById("workspace-switcher").addEventListener("change", async (event) => {
  state.scope = event.target.value;
  state.openContact = null;
  document.getElementById("detail").hidden = true;
  client.watch({ scope: state.scope });
  // The companies listed are the first workspace's: reload the page to query another's.
  byCompany.stop();
  document.getElementById("by-company").hidden = true;
  history.pushState({}, "", `/w/${state.scope}/`);
  document.getElementById("workspace-name").textContent =
    event.target.selectedOptions[0].textContent;
  await refreshContacts();
});

// A live query: the contacts of one company, kept exact by the server (docs/live-queries.md).
function renderCompanyContacts(rows) {
  document.getElementById("company-contacts").innerHTML = rows
    .map((c) => `<li data-id="${c.id}">${escapeHtml(c.name)}</li>`)
    .join("");
}
const companyFilter = document.getElementById("company-filter");
const byCompany = client.liveQuery(
  { id: "by-company", model: "contact", where: { company: Number(companyFilter.value) || null } },
  { onChange: renderCompanyContacts, onError: (message) => toast(`Live list refused: ${message}`) },
);
companyFilter.addEventListener("change", () =>
  byCompany.replace({ where: { company: Number(companyFilter.value) || null } }),
);

client.subscribe("contact");
client.connect();
window.realtimeClient = client; // handy from the browser console
