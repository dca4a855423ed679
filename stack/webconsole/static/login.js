// The login page: a pasted token (a person's or the admin token) becomes a session cookie, then the console.
"use strict";

async function login(event) {
  event.preventDefault();
  const token = document.querySelector("#login-token").value.trim();
  const response = await fetch("/api/login", {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Concierge-Console": "1" },
    body: JSON.stringify({ token }),
  });
  if (response.ok) {
    window.location.assign("/");
    return;
  }
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body.error) message = `${body.error.code}: ${body.error.message || ""}`;
    else if (Array.isArray(body.detail)) message = body.detail.map((d) => d.msg).join("; ");
  } catch (e) { /* not JSON */ }
  document.querySelector("#login-result").textContent = `refused: ${message}`;
}

document.querySelector("#login-form").addEventListener("submit", login);
