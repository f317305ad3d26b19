// Gangway status page: polls the server-rendered fragments of each section and swaps them
// in; keeps only paging and filter state. No framework and no build step: the service
// serves this file as it is.

const KEY = "gangway.apiKey";

function authHeaders() {
  const key = localStorage.getItem(KEY);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function setLive(ok, text) {
  const live = document.getElementById("live");
  if (!live) return;
  live.textContent = text;
  live.classList.toggle("offline", !ok);
}

function askForKey() {
  const form = document.getElementById("key-form");
  if (form.hidden) {
    form.hidden = false;
    document.getElementById("key-input").focus();
  }
}

// A 401 asks for a key only when the request carried the key held now: a poll sent before
// the user gave a key answers 401 after the form was submitted; it is sent again with the
// new key instead of reopening the form.
async function get(url) {
  const sentKey = localStorage.getItem(KEY);
  const response = await fetch(url, { headers: authHeaders() });
  if (response.status === 401) {
    if (localStorage.getItem(KEY) !== sentKey) return get(url);
    askForKey();
    throw new Error("an API key is needed");
  }
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return response;
}

async function refresh(section) {
  try {
    const html = await (await get(section.dataset.src)).text();
    if (section.lastHtml !== html) {
      section.innerHTML = html;
      section.lastHtml = html;
    }
    setLive(true, `live, updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setLive(false, `not updating: ${error.message}`);
  }
}

function refreshAll() {
  document.querySelectorAll(".fragment").forEach(refresh);
}

function follow(section) {
  refresh(section);
  const every = Number(section.dataset.every || 0);
  if (every > 0) {
    setInterval(() => {
      if (!document.hidden) refresh(section);
    }, every);
  }
}

// Paging links inside a fragment change that section's source, not the page.
document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-nav]");
  if (link) {
    event.preventDefault();
    const section = link.closest(".fragment");
    const url = new URL(section.dataset.src, location.origin);
    const next = new URL(link.getAttribute("href"), url);
    for (const [name, value] of next.searchParams) url.searchParams.set(name, value);
    if (!next.searchParams.has("cursor")) url.searchParams.delete("cursor");
    section.dataset.src = url.pathname + url.search;
    refresh(section);
    return;
  }
  const cancel = event.target.closest("button[data-cancel]");
  if (cancel) cancelIt(cancel.dataset.kind || "job", cancel.dataset.cancel, cancel);
});

// A job's or a sweep's cancel button: `data-cancel` is its id, `data-kind` what it is.
async function cancelIt(kind, id, button) {
  if (!confirm(`Cancel ${kind} ${id}?`)) return;
  button.disabled = true;
  const sentKey = localStorage.getItem(KEY);
  const response = await fetch(`/v1/${kind}s/${id}/cancel`, {
    method: "POST",
    headers: authHeaders(),
  });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    alert(`Not cancelled: ${body.error ? body.error.message : response.status}`);
    if (response.status === 401 && localStorage.getItem(KEY) === sentKey) askForKey();
    button.disabled = false;
  }
  refreshAll();
}

// Filters rewrite the query of the section they are for, back at its first page.
function watchFilters(form) {
  const section = document.getElementById(form.dataset.for);
  const apply = () => {
    const url = new URL(section.dataset.src, location.origin);
    url.search = "";
    for (const [name, value] of new FormData(form)) if (value) url.searchParams.set(name, value);
    section.dataset.src = url.pathname + url.search;
    refresh(section);
  };
  form.addEventListener("change", apply);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    apply();
  });
}

// The log tail: the last lines, then every new one (`after` the newest id seen).
async function followLogs(pre) {
  const job = pre.dataset.job;
  let after = null;
  const poll = async () => {
    const query = after === null ? "tail=500" : `after=${after}&tail=1000`;
    try {
      const { lines } = await (await get(`/v1/jobs/${job}/logs?${query}`)).json();
      if (lines.length) {
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.append(lines.map((l) => `[rank ${l.rank}] ${l.line}\n`).join(""));
        after = lines[lines.length - 1].id;
        while (pre.childNodes.length > 2000) pre.removeChild(pre.firstChild);
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      } else if (after === null) {
        after = 0;
      }
    } catch (error) {
      setLive(false, `not updating: ${error.message}`);
    }
  };
  await poll();
  setInterval(() => {
    if (!document.hidden) poll();
  }, 1500);
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  localStorage.setItem(KEY, document.getElementById("key-input").value.trim());
  event.target.hidden = true;
  refreshAll();
});

document.querySelectorAll(".fragment").forEach(follow);
document.querySelectorAll("form.filters").forEach(watchFilters);
document.querySelectorAll("pre.log").forEach(followLogs);
