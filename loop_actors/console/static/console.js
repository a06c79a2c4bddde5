// The console's own script (served from the package; no inline script, nothing from elsewhere).
// It keeps the token in sessionStorage (this tab only), sends the decision forms with it as
// `Authorization: Bearer ...`, and follows an invocation's live event stream. Text from the
// server is put in the page with textContent, never as HTML.
"use strict";

const TOKEN_KEY = "loop-actors-console-token";

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function flash(text, failed) {
  const box = document.getElementById("flash");
  if (!box) return;
  box.textContent = text;
  box.className = failed ? "error" : "ok";
}

function showTokenState() {
  const state = document.getElementById("token-state");
  if (state) state.textContent = token() ? "token kept for this tab" : "no token: decisions are refused";
}

function setUpToken() {
  const form = document.getElementById("token-form");
  if (!form) return;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token");
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = "";
    showTokenState();
  });
  showTokenState();
}

// POST a JSON body with the token; the response and its JSON (or its status text).
async function postJson(url, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", "Authorization": `Bearer ${token()}` },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
  let answer = {};
  try {
    answer = await response.json();
  } catch (error) {
    answer = { detail: response.statusText };
  }
  return [response, answer];
}

async function decide(form) {
  const body = {};
  for (const [name, value] of new FormData(form).entries()) {
    if (value !== "") body[name] = value;
  }
  if (form.dataset.digest) body.digest = form.dataset.digest;
  const id = form.dataset.invocation || form.dataset.label;
  const url = form.dataset.url || `/api/invocations/${encodeURIComponent(id)}/${form.dataset.action}`;
  const [response, answer] = await postJson(url, body);
  if (response.ok) {
    flash(`${id}: ${answer.recorded || answer.result || answer.resolution} by ${answer.by || "?"}`, false);
    const section = document.getElementById(`approval-${id}`);
    if (section) section.classList.add("decided");
    for (const other of document.querySelectorAll("form.decide")) {
      if ((other.dataset.invocation || other.dataset.label) === id) {
        for (const button of other.querySelectorAll("button")) button.disabled = true;
      }
    }
  } else {
    flash(`${id}: ${response.status} ${answer.error || ""}: ${answer.detail || ""}`, true);
  }
}

function setUpForms() {
  for (const form of document.querySelectorAll("form.decide")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      decide(form).catch((error) => flash(String(error), true));
    });
  }
}

// A bulk action over the list's filter: a dry run first, then the typed confirmation it gave.
function setUpBulk() {
  const form = document.getElementById("bulk-form");
  if (!form) return;
  const where = JSON.parse(form.dataset.where || "{}");
  const said = document.getElementById("bulk-dry");
  const body = (extra) => {
    const fields = { where };
    for (const name of ["by", "reason"]) {
      if (form.elements[name].value !== "") fields[name] = form.elements[name].value;
    }
    return { ...fields, ...extra };
  };
  const url = () => `/api/bulk/${encodeURIComponent(form.elements.action.value)}`;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    postJson(url(), body({ dry_run: true })).then(([response, answer]) => {
      if (!response.ok) {
        said.textContent = `${response.status} ${answer.error || ""}: ${answer.detail || ""}`;
        said.className = "error";
        return;
      }
      const skipped = answer.skipped.map((s) => `${s.invocation_id} (${s.why}: ${s.detail})`);
      said.textContent = `${answer.matched} to ${form.elements.action.value}: ` +
        `${answer.invocation_ids.join(", ") || "none"}` +
        (skipped.length ? `; left alone: ${skipped.join("; ")}` : "") +
        `. Type "${answer.confirm}" to confirm.`;
      said.className = "ok";
      document.getElementById("bulk-confirm-text").textContent = answer.confirm;
    }).catch((error) => flash(String(error), true));
  });
  document.getElementById("bulk-apply").addEventListener("click", () => {
    const confirm = form.elements.confirm.value;
    postJson(url(), body({ dry_run: false, confirm })).then(([response, answer]) => {
      if (response.ok) {
        const results = Object.entries(answer.results).map(([id, r]) => `${id}: ${r}`);
        flash(`${form.elements.action.value}: ${results.join(", ") || "nothing"}`, false);
      } else {
        flash(`${response.status} ${answer.error || ""}: ${answer.detail || ""}`, true);
      }
    }).catch((error) => flash(String(error), true));
  });
}

function follow() {
  const head = document.getElementById("head");
  const live = document.getElementById("live");
  if (!head || !live || !window.EventSource) return;
  if (head.dataset.status === "terminated") return;
  const id = head.dataset.invocation;
  // The page shows the events up to data-events; the stream gives the ones after.
  const url = `/api/invocations/${encodeURIComponent(id)}/events?after=${head.dataset.events}`;
  const source = new EventSource(url);
  const onEvent = (event) => {
    const record = JSON.parse(event.data);
    const item = document.createElement("li");
    item.textContent = `${record.position} ${record.type} ${record.timestamp}`;
    live.appendChild(item);
    if (record.type === "Terminated" || record.type === "Paused") {
      source.close();
      window.setTimeout(() => window.location.reload(), 300);
    }
  };
  for (const type of ["InvocationStarted", "SettingsChanged", "DecisionProposed", "BatchDispatched",
    "ResultsCommitted", "BudgetReserved", "BudgetReturned", "Paused", "ApprovalGranted",
    "ApprovalDenied", "ClarificationProvided", "VerificationFailed", "ContextCompacted",
    "LeaseAcquired", "Terminated"]) {
    source.addEventListener(type, onEvent);
  }
  source.onmessage = onEvent;
}

document.addEventListener("DOMContentLoaded", () => {
  setUpToken();
  setUpForms();
  setUpBulk();
  follow();
});
