// sessionwatch status page: live updates over Server-Sent Events. The server renders every
// fragment (escaped by its templates); this script only fetches and swaps them. No timer.
"use strict";
(function () {
  const live = document.getElementById("live");
  const badge = document.getElementById("live-state");
  const timeline = document.getElementById("timeline");
  let openKey = null;
  let pending = null;

  function say(state) {
    badge.dataset.state = state;
    badge.textContent = state;
  }

  // The element of class `cls` (and `key`, for a session's link) under `root`.
  function find(root, cls, key) {
    const all = Array.from(root.getElementsByClassName(cls));
    return all.find((element) => element.dataset.key === key);
  }

  const FOCUSABLE = ["open-timeline", "close-timeline"];

  // A fragment swapped in replaces the elements it had: what had focus in it (a session's
  // link, the timeline's close button) gets it back in the new one.
  async function fetchInto(url, target) {
    const answer = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (answer.status === 401) {
      say("logged out");
      return false;
    }
    if (answer.ok) {
      const html = await answer.text();
      const had = document.activeElement;
      const cls = FOCUSABLE.find((c) => target.contains(had) && had.classList.contains(c));
      const key = cls === undefined ? undefined : had.dataset.key;
      target.innerHTML = html;
      const again = cls === undefined ? undefined : find(target, cls, key);
      if (again !== undefined) {
        again.focus();
      }
    }
    return answer.ok;
  }

  // What a live refresh changed, said to a screen reader (the polite #announce region): the
  // sessions by state, when that summary moved; not the whole table again.
  const announce = document.getElementById("announce");

  async function refresh() {
    pending = null;
    await fetchInto("/ui/live" + location.search, live);
    const summary = document.getElementById("summary");
    if (summary !== null && announce.textContent !== summary.textContent) {
      announce.textContent = summary.textContent;
    }
    if (openKey !== null) {
      await fetchInto("/ui/sessions/" + encodeURIComponent(openKey), timeline);
    }
  }

  function changed() {
    if (pending === null) {
      pending = setTimeout(refresh, 100); // a burst of changes is one fetch
    }
  }

  // Focus goes back to the link that opened the timeline: found again by its key, since a
  // live refresh while the timeline was open replaced the table and that link with it.
  function hide() {
    const key = openKey;
    openKey = null;
    timeline.hidden = true;
    const opener = find(live, "open-timeline", key);
    if (opener !== undefined) {
      opener.focus();
    }
  }

  // Closing: the button, Escape, or Back (opening pushed a history entry for it).
  function close() {
    if (history.state && history.state.timeline) {
      history.back(); // popstate hides it
    } else {
      hide();
    }
  }

  document.addEventListener("click", async function (event) {
    const link = event.target.closest(".open-timeline");
    if (link) {
      event.preventDefault();
      const key = link.dataset.key;
      if (await fetchInto("/ui/sessions/" + encodeURIComponent(key), timeline)) {
        if (openKey === null) {
          history.pushState({ timeline: key }, "", "#timeline");
        }
        openKey = key;
        timeline.hidden = false;
        timeline.scrollIntoView({ block: "start" }); // it opens below the links
        timeline.querySelector(".close-timeline").focus();
      }
    } else if (event.target.closest(".close-timeline")) {
      close();
    }
  });

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && openKey !== null) {
      close();
    }
  });

  window.addEventListener("popstate", function () {
    if (openKey !== null) {
      hide();
    }
  });

  const stream = new EventSource("/ui/stream");
  stream.addEventListener("open", function () {
    say("live");
    changed(); // whatever happened while the stream was down
  });
  stream.addEventListener("changed", changed);
  stream.addEventListener("doing", changed); // what a session is doing: the panel, too
  stream.addEventListener("error", function () {
    say("reconnecting");
  });
})();
