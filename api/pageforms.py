"""The status page's small forms (pure HTML, no script): the login, the confirmation an action asks
for, and the answer after one. Every form posts back to the daemon with its CSRF token."""

from __future__ import annotations

import html

from api import promote
from supervisor.status.snapshot import StatusSnapshot

ACTIONS = ("restart", "stop", "start", "diagnose")  # the bar at the top of every page
# What the page may post: the bar's, and `promote`, offered in the fallback banner only.
POSTABLE = (*ACTIONS, "promote")
# What each action does to the server, said on the confirmation page before anything happens.
CONSEQUENCES = {
    "restart": "stops the server (requests in flight fail), verifies its GPUs are free and launches it again",
    "stop": "stops the server and keeps it stopped until someone starts it",
    "start": "launches the server (from the preferred rung out of failed)",
    "diagnose": "captures py-spy stacks of every server process now (the server keeps running)",
}
_HEAD = (
    "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title} - sglang-supervisor</title>"
    "<style>body{{font:15px/1.5 system-ui,sans-serif;margin:48px auto;max-width:520px;color:#1f2328}}"
    "input,button{{font:inherit;padding:6px 10px}} .err{{color:#cf222e}} .muted{{color:#57606a}}</style></head><body>"
)


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def login_page(error: str) -> str:
    err = f"<p class='err' id='login-error'>{_e(error)}</p>" if error else ""
    return (
        _HEAD.format(title="log in") + "<h1>sglang-supervisor</h1><p>This daemon needs its API token "
        "(the contents of <code>[api] token_file</code>).</p>"
        + err
        + "<form method='post' action='/ui/login'><input type='password' name='token' id='token' "
        "autocomplete='current-password' required autofocus size='40'> <button type='submit' id='login'>log in</button>"
        "</form><p class='muted'>The session lasts 12 hours, ends when you log out, and ends for everyone "
        "when the token is rotated. Scripts send <code>Authorization: Bearer</code> instead.</p></body></html>"
    )


def consequence(kind: str, s: StatusSnapshot) -> str:
    return promote.consequence(s) if kind == "promote" else CONSEQUENCES.get(kind, kind) + "."


def confirm_page(kind: str, csrf: str, s: StatusSnapshot) -> str:
    where = f"state {s.state}" + (f", rung {s.rung}" if s.rung else "")
    return (
        _HEAD.format(title=f"confirm {kind}") + f"<h1>{_e(kind)}?</h1><p>The server is in {_e(where)}. "
        f"<span id='consequence'>This {_e(consequence(kind, s))}</span></p>"
        "<p class='muted'>It is journalled with who asked.</p>"
        "<form method='post' action='/ui/action'>"
        f"<input type='hidden' name='action' value='{_e(kind)}'><input type='hidden' name='csrf' value='{_e(csrf)}'>"
        "<input type='hidden' name='confirm' value='yes'>"
        f"<button type='submit' id='confirm'>yes, {_e(kind)}</button> <a href='/ui'>cancel</a></form></body></html>"
    )


def done_page(text: str) -> str:
    return (
        _HEAD.format(title="done")
        + f"<p id='result'>{_e(text)}</p><p><a href='/ui'>back to the status page</a></p></body></html>"
    )


def action_form(kind: str, csrf: str, label: str = "", where: str = "") -> str:
    """One button that posts `kind`; the daemon answers a confirmation page first. `where` makes the
    id unique when the same action is offered twice on one page (the bar and a banner)."""
    return (
        "<form method='post' action='/ui/action' style='display:inline'>"
        f"<input type='hidden' name='action' value='{_e(kind)}'><input type='hidden' name='csrf' value='{_e(csrf)}'>"
        f"<button type='submit' id='{where or 'act'}-{_e(kind)}'>{_e(label or kind)}</button></form> "
    )


def action_bar(csrf: str, session: bool) -> str:
    """The page's buttons: each posts a form that answers a confirmation page first."""
    buttons = "".join(action_form(a, csrf) for a in ACTIONS)
    logout = (
        "<form method='post' action='/ui/logout' style='display:inline'>"
        f"<input type='hidden' name='csrf' value='{_e(csrf)}'><button type='submit' id='logout'>log out</button></form>"
        if session
        else ""
    )
    return f"<div id='actions'>{buttons}{logout}</div>"
