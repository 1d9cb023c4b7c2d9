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

  async function fetchInto(url, target) {
    const answer = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (answer.status === 401) {
      say("logged out");
      return false;
    }
    if (answer.ok) {
      target.innerHTML = await answer.text();
    }
    return answer.ok;
  }

  async function refresh() {
    pending = null;
    await fetchInto("/ui/live", live);
    if (openKey !== null) {
      await fetchInto("/ui/sessions/" + encodeURIComponent(openKey), timeline);
    }
  }

  function changed() {
    if (pending === null) {
      pending = setTimeout(refresh, 100); // a burst of changes is one fetch
    }
  }

  document.addEventListener("click", async function (event) {
    const link = event.target.closest(".open-timeline");
    if (link) {
      event.preventDefault();
      openKey = link.dataset.key;
      if (await fetchInto("/ui/sessions/" + encodeURIComponent(openKey), timeline)) {
        timeline.hidden = false;
      }
    } else if (event.target.closest(".close-timeline")) {
      openKey = null;
      timeline.hidden = true;
    }
  });

  const stream = new EventSource("/ui/stream");
  stream.addEventListener("open", function () {
    say("live");
    changed(); // whatever happened while the stream was down
  });
  stream.addEventListener("changed", changed);
  stream.addEventListener("error", function () {
    say("reconnecting");
  });
})();
