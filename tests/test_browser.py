"""The example project's live page in a real browser (headless Chromium, Playwright).

The example project runs in its own process, on its own SQLite file, exactly as
``scripts/example`` serves it; writes come from other processes (``manage.py shell``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, WebSocket, expect, sync_playwright

from tests.example import ExampleProject as Example

ROOT = Path(__file__).resolve().parent.parent
#: Ignored by git; `scripts/docs-image` copies it to docs/img/live-page.png.
SCREENSHOT = ROOT / "tests" / "output" / "live-page.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 10_000


@pytest.fixture(scope="module")
def example() -> Iterator[Example]:
    with tempfile.TemporaryDirectory() as workdir:
        project = Example(Path(workdir))
        project.prepare()
        project.start_runserver()
        yield project
        project.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def signed_in(browser: Browser, example: Example, username: str) -> Page:
    page = browser.new_page(viewport={"width": 1100, "height": 640})
    page.goto(f"{example.url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "demo")
    page.click("button[type=submit]")
    page.wait_for_url(f"{example.url}/w/**")
    expect(page.locator("#connection")).to_have_attribute("data-state", "open", timeout=WAIT_MS)
    return page


def contact_id(example: Example, name: str) -> int:
    code = (
        "from example_project.crm.models import Contact; "
        f"print(Contact.objects.get(name={name!r}).pk)"
    )
    return int(example.shell(code).strip())


def test_a_contact_edited_in_another_process_changes_on_the_page(
    browser: Browser, example: Example
) -> None:
    page = signed_in(browser, example, "alice")
    expect(page.locator("#contacts")).to_contain_text("Ben Wyatt")
    example.shell(
        "from example_project.crm.models import Contact; "
        "c = Contact.objects.get(name='Ben Wyatt'); c.name = 'Ben Wyatt (renamed)'; c.save()"
    )
    expect(page.locator("#contacts")).to_contain_text("Ben Wyatt (renamed)", timeout=WAIT_MS)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    page.close()


#: Test instrumentation: the page's <html> says the state ``realtime:state`` last told.
STATE_ON_HTML = (
    "document.addEventListener('realtime:state', "
    "(event) => { document.documentElement.dataset.realtime = event.detail.state; });"
)


def test_a_server_rendered_partial_is_fetched_again_when_a_write_elsewhere_commits(
    browser: Browser, example: Example
) -> None:
    page = signed_in(browser, example, "alice")
    slug = page.url.rstrip("/").rsplit("/", 1)[-1]
    rows = f"{example.url}/w/{slug}/server-rendered/rows"
    page.add_init_script(STATE_ON_HTML)
    # Once open, the page fetches its rows again (what committed since it was rendered).
    with page.expect_response(rows, timeout=WAIT_MS):
        page.goto(f"{example.url}/w/{slug}/server-rendered/")
    expect(page.locator("html")).to_have_attribute("data-realtime", "open", timeout=WAIT_MS)
    expect(page.locator("#contacts")).not_to_contain_text("Written elsewhere")
    page.evaluate("window.sameDocument = true")

    with page.expect_response(rows, timeout=WAIT_MS):
        example.shell(
            "from example_project.crm.models import Contact, Workspace; "
            f"Contact.objects.create(workspace=Workspace.objects.get(slug={slug!r}), "
            "name='Written elsewhere')"
        )
    expect(page.locator("#contacts")).to_contain_text("Written elsewhere", timeout=WAIT_MS)
    assert page.evaluate("window.sameDocument") is True  # the partial came back, not the page
    page.close()


def test_the_live_page_reads_again_what_committed_before_its_socket_opened(
    browser: Browser, example: Example
) -> None:
    page = signed_in(browser, example, "alice")
    slug = page.url.rstrip("/").rsplit("/", 1)[-1]
    # Load the page again, holding its script back until a write has committed: the write
    # lands after the HTML was rendered, before the socket opened.
    held: list[Route] = []
    page.route("**/static/crm/live.js", lambda route: held.append(route))
    page.goto(f"{example.url}/w/{slug}/", wait_until="commit")
    deadline = time.monotonic() + WAIT_MS / 1000
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert held, "live.js was not requested"
    example.shell(
        "from example_project.crm.models import Contact, Workspace; "
        f"Contact.objects.create(workspace=Workspace.objects.get(slug={slug!r}), "
        "name='Between render and open')"
    )
    held[0].continue_()
    expect(page.locator("#contacts")).to_contain_text("Between render and open", timeout=WAIT_MS)
    page.close()


def test_a_deleted_contact_disappears_from_the_page(browser: Browser, example: Example) -> None:
    page = signed_in(browser, example, "alice")
    expect(page.locator("#contacts")).to_contain_text("Chris Traeger")
    example.shell(
        "from example_project.crm.models import Contact; "
        "Contact.objects.get(name='Chris Traeger').delete()"
    )
    expect(page.locator("#contacts")).not_to_contain_text("Chris Traeger", timeout=WAIT_MS)
    page.close()


def test_a_private_note_appears_for_its_author_only(browser: Browser, example: Example) -> None:
    ann = contact_id(example, "Ann Perkins")
    alice, bob = signed_in(browser, example, "alice"), signed_in(browser, example, "bob")
    for page in (alice, bob):
        page.click(f"#contacts tr[data-id='{ann}']")
        expect(page.locator("#detail-name")).to_have_text("Ann Perkins", timeout=WAIT_MS)
    example.shell(
        "from django.contrib.auth.models import User; "
        "from example_project.crm.models import Contact, PrivateNote; "
        "ann = Contact.objects.get(name='Ann Perkins'); "
        "PrivateNote.objects.create(workspace=ann.workspace, contact=ann, "
        "author=User.objects.get(username='alice'), text='Only alice reads this')"
    )
    expect(alice.locator("#detail-private-notes")).to_contain_text(
        "Only alice reads this", timeout=WAIT_MS
    )
    # A change both may see, made afterwards, reaches bob: the note never did.
    example.shell(
        "from example_project.crm.models import Contact; "
        "c = Contact.objects.get(name='Ann Perkins'); c.email = 'ann@new.example'; c.save()"
    )
    expect(bob.locator("#detail-email")).to_have_text("ann@new.example", timeout=WAIT_MS)
    expect(bob.locator("#detail-private-notes")).not_to_contain_text("Only alice reads this")
    alice.close()
    bob.close()


def test_a_server_restart_shows_reconnecting_and_recovers(
    browser: Browser, example: Example
) -> None:
    page = signed_in(browser, example, "carol")
    example.stop()
    expect(page.locator("#connection")).to_have_attribute(
        "data-state", "reconnecting", timeout=WAIT_MS
    )
    example.start()
    expect(page.locator("#connection")).to_have_attribute("data-state", "open", timeout=40_000)
    example.shell(
        "from example_project.crm.models import Contact, Workspace; "
        "Contact.objects.create("
        "workspace=Workspace.objects.get(slug='globex'), name='After restart')"
    )
    expect(page.locator("#contacts")).to_contain_text("After restart", timeout=WAIT_MS)
    page.close()


def test_a_refused_token_shows_a_clear_state(browser: Browser, example: Example) -> None:
    example.shell(
        "from django.contrib.auth.models import User; "
        "from example_project.crm.models import Membership, Workspace; "
        "u = User.objects.create_user('dora', password='demo'); "
        "Membership.objects.create(user=u, workspace=Workspace.objects.get(slug='acme'))"
    )
    page = signed_in(browser, example, "dora")
    # Deactivating the account makes its token stand for nobody, and signs it out: the
    # page cannot get a fresh token either, so it says it was refused.
    example.shell(
        "from django.contrib.auth.models import User; "
        "u = User.objects.get(username='dora'); u.is_active = False; u.save()"
    )
    expect(page.locator("#connection")).to_have_attribute("data-state", "refused", timeout=WAIT_MS)
    expect(page.locator("#connection")).to_contain_text("Invalid authentication token")
    page.close()


def test_a_contact_moved_to_another_workspace_leaves_one_page_and_enters_the_other(
    browser: Browser, example: Example
) -> None:
    example.shell(
        "from example_project.crm.models import Contact, Workspace; "
        "Contact.objects.create(workspace=Workspace.objects.get(slug='acme'), name='Mo Ving')"
    )
    moving = contact_id(example, "Mo Ving")
    alice, bob = signed_in(browser, example, "alice"), signed_in(browser, example, "bob")
    carol = signed_in(browser, example, "carol")  # reads globex only
    for page in (alice, bob):
        expect(page.locator("#contacts")).to_contain_text("Mo Ving", timeout=WAIT_MS)
    expect(carol.locator("#contacts")).not_to_contain_text("Mo Ving")
    alice.click(f"#contacts tr[data-id='{moving}']")
    expect(alice.locator("#detail-name")).to_have_text("Mo Ving", timeout=WAIT_MS)
    alice.select_option("#move-target", "globex")
    alice.click("#move-form button[type=submit]")
    # acme's pages drop it, globex's page shows it: each heard what changed for it.
    expect(bob.locator("#contacts")).not_to_contain_text("Mo Ving", timeout=WAIT_MS)
    expect(alice.locator("#contacts")).not_to_contain_text("Mo Ving", timeout=WAIT_MS)
    expect(carol.locator("#contacts")).to_contain_text("Mo Ving", timeout=WAIT_MS)
    for page in (alice, bob, carol):
        page.close()


def test_the_live_list_of_a_company_follows_writes_made_elsewhere(
    browser: Browser, example: Example
) -> None:
    """The example page's live query: the contacts of one company, kept by the server."""
    page = signed_in(browser, example, "alice")
    listed = page.locator("#company-contacts")
    page.select_option("#company-filter", label="Hooli")
    expect(listed).to_contain_text("Ben Wyatt", timeout=WAIT_MS)
    expect(listed).not_to_contain_text("Ann Perkins")
    example.shell(
        "from example_project.crm.models import Company, Contact; "
        "c = Contact.objects.get(name='Ann Perkins'); "
        "c.company = Company.objects.get(name='Hooli'); c.save()"
    )
    expect(listed).to_contain_text("Ann Perkins", timeout=WAIT_MS)
    page.select_option("#company-filter", label="Initech")
    expect(listed).not_to_contain_text("Ann Perkins", timeout=WAIT_MS)
    example.shell(
        "from example_project.crm.models import Company, Contact; "
        "c = Contact.objects.get(name='Ann Perkins'); "
        "c.company = Company.objects.get(name='Initech'); c.save()"
    )
    expect(listed).to_contain_text("Ann Perkins", timeout=WAIT_MS)
    page.close()


@pytest.fixture(scope="module")
def boosted() -> Iterator[Example]:
    """The example project with htmx-boosted pages (tests/boosted/)."""
    with tempfile.TemporaryDirectory() as workdir:
        project = Example(Path(workdir), DJANGO_SETTINGS_MODULE="tests.boosted.settings")
        project.prepare()
        project.start_runserver()
        yield project
        project.stop()


class Sockets:
    """The sockets a page opened and closed, as the browser saw them."""

    def __init__(self, page: Page) -> None:
        self.opened = self.closed = 0
        page.on("websocket", self._opened)

    def _opened(self, socket: WebSocket) -> None:
        self.opened += 1
        socket.on("close", self._closed)

    def _closed(self, _socket: WebSocket) -> None:
        self.closed += 1

    @property
    def open(self) -> int:
        return self.opened - self.closed


def wait_until(page: Page, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while not condition() and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert condition()


def boosted_visit(page: Page, link: str) -> None:
    """Follow ``link`` as htmx boosts it (the body swapped, the document kept), and give the
    scripts it swapped in a second to run (a client started there opens within it)."""
    page.evaluate("document.querySelector('nav').dataset.old = 'yes'")
    page.click(link)
    page.wait_for_selector("nav:not([data-old])", timeout=WAIT_MS)
    page.wait_for_timeout(1000)
    assert page.evaluate("window.sameDocument") is True


def created_on_the_page(page: Page, example: Example, slug: str, name: str) -> int:
    """Create contact ``name`` in another process; the rows fetches until the page shows it."""
    fetched: list[str] = []
    page.on(
        "request", lambda request: fetched.append(request.url) if "/rows" in request.url else None
    )
    example.shell(
        "from example_project.crm.models import Contact, Workspace; "
        f"Contact.objects.create(workspace=Workspace.objects.get(slug={slug!r}), name={name!r})"
    )
    expect(page.locator("#contacts")).to_contain_text(name, timeout=WAIT_MS)
    return len(fetched)


def test_boosted_visits_keep_one_socket_and_a_page_without_the_tag_closes_it(
    browser: Browser, boosted: Example
) -> None:
    page = signed_in(browser, boosted, "alice")
    sockets = Sockets(page)
    page.add_init_script(STATE_ON_HTML)
    page.goto(f"{boosted.url}/boosted/w/acme/")
    expect(page.locator("html")).to_have_attribute("data-realtime", "open", timeout=WAIT_MS)
    page.evaluate("window.sameDocument = true")
    # The same page again: htmx runs its module script again, which keeps the running client.
    for _ in range(2):
        boosted_visit(page, "#to-acme")
    assert (sockets.opened, sockets.closed) == (1, 0)
    assert created_on_the_page(page, boosted, "acme", "Boosted twice") == 1
    # A page without the tag: the client leaves with its element, its socket closes.
    boosted_visit(page, "#to-away")
    wait_until(page, lambda: sockets.open == 0)
    boosted_visit(page, "#to-acme")
    wait_until(page, lambda: sockets.open == 1)
    assert created_on_the_page(page, boosted, "acme", "Boosted back") == 1
    # Another scope: the acme client closes, a globex one starts.
    boosted_visit(page, "#to-globex")
    wait_until(page, lambda: (sockets.opened, sockets.closed) == (3, 2))
    assert created_on_the_page(page, boosted, "globex", "Boosted elsewhere") == 1
    page.close()


def test_a_page_restored_from_htmx_history_keeps_one_socket(
    browser: Browser, boosted: Example
) -> None:
    page = signed_in(browser, boosted, "bob")
    sockets = Sockets(page)
    page.add_init_script(STATE_ON_HTML)
    page.goto(f"{boosted.url}/boosted/w/acme/")
    expect(page.locator("html")).to_have_attribute("data-realtime", "open", timeout=WAIT_MS)
    page.evaluate("window.sameDocument = true")
    boosted_visit(page, "#to-away")
    wait_until(page, lambda: sockets.open == 0)
    page.go_back()
    expect(page.locator("#contacts")).to_be_visible(timeout=WAIT_MS)
    wait_until(page, lambda: sockets.open == 1)
    page.wait_for_timeout(1000)
    assert sockets.open == 1
    assert page.evaluate("window.sameDocument") is True
    assert created_on_the_page(page, boosted, "acme", "Restored from history") == 1
    page.close()


def test_a_burst_of_writes_all_reach_a_server_rendered_page(
    browser: Browser, example: Example
) -> None:
    """htmx's default queueing (one fetch in flight, the last event queued) reads after the
    burst's last write, as docs/htmx.md says; ``throttle:`` would have dropped the second."""
    page = signed_in(browser, example, "bob")
    page.add_init_script(STATE_ON_HTML)
    page.goto(f"{example.url}/w/acme/server-rendered/")
    expect(page.locator("html")).to_have_attribute("data-realtime", "open", timeout=WAIT_MS)
    example.shell(
        "import time; from example_project.crm.models import Contact, Workspace; "
        "acme = Workspace.objects.get(slug='acme'); "
        "Contact.objects.create(workspace=acme, name='Burst first'); time.sleep(0.3); "
        "Contact.objects.create(workspace=acme, name='Burst second'); "
        "Contact.objects.create(workspace=acme, name='Burst third')"
    )
    for name in ("Burst first", "Burst second", "Burst third"):
        expect(page.locator("#contacts")).to_contain_text(name, timeout=WAIT_MS)
    page.close()


def test_a_server_rendered_page_whose_session_ended_goes_to_sign_in_whole(
    browser: Browser, example: Example
) -> None:
    """The partial's view answers an htmx request without a session by reloading the page,
    not with the redirect to the sign-in page that htmx would swap into the table."""
    page = signed_in(browser, example, "bob")
    page.goto(f"{example.url}/w/acme/server-rendered/")
    expect(page.locator("#contacts")).to_contain_text("Ann Perkins")
    page.context.clear_cookies()  # signed out, as in another tab
    page.evaluate("document.dispatchEvent(new CustomEvent('realtime:contact.updated'))")
    # Polled, not waited for as one navigation: a fetch the socket's opening asked for may
    # come back without a session too, and its reload then cuts this one short.
    expect(page).to_have_url(f"{example.url}/login/?next=/w/acme/server-rendered/", timeout=WAIT_MS)
    expect(page.locator("input[name=username]")).to_have_count(1)
    page.close()


def test_a_server_rendered_page_signed_out_in_another_tab_goes_to_sign_in(
    browser: Browser, example: Example
) -> None:
    """Signing out refuses the page's socket at once (its token was the session's): the
    refusal fetches the partial, which reloads the page to the sign-in form."""
    page = signed_in(browser, example, "bob")
    # The rows fetched when the socket opens, done before the sign-out: no fetch on its way.
    with page.expect_response(lambda response: response.url.endswith("/rows")):
        page.goto(f"{example.url}/w/acme/server-rendered/")
    expect(page.locator("#contacts")).to_contain_text("Ann Perkins")
    # Signed out as another tab would: a POST to the sign-out view, with the session's cookie.
    page.evaluate(
        """async () => {
            const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
            await fetch('/logout/', {method: 'POST', headers: {'X-CSRFToken': token}});
        }"""
    )
    expect(page).to_have_url(f"{example.url}/login/?next=/w/acme/server-rendered/", timeout=WAIT_MS)
    page.close()
