// jobq dashboard: live refresh, and "tick all" on the dead letter. No build, no dependency.
// Every few seconds the page is fetched again and each [data-live] section is replaced by the
// new one of the same id; a section is left alone while the reader works in it (a ticked
// checkbox, a focused field). The pages work without this script, only without the refresh.
(function () {
  "use strict";
  var everyMs = (Number(document.body.dataset.refreshS) || 5) * 1000;
  var live = document.getElementById("live");

  function busy(section) {
    if (section.contains(document.activeElement) && document.activeElement !== document.body) {
      return true;
    }
    return section.hasAttribute("data-hold-when-ticked") &&
      section.querySelector("input[type=checkbox]:checked") !== null;
  }

  function wireTickAll(root) {
    root.querySelectorAll("[data-tick-all]").forEach(function (box) {
      box.closest("label").hidden = false;
      box.addEventListener("change", function () {
        box.closest("form").querySelectorAll("input[name=id]").forEach(function (b) {
          b.checked = box.checked;
        });
      });
    });
  }

  // The next refresh is scheduled once this one has finished (never on a fixed interval): a
  // slow answer delays the next instead of stacking requests on a busy server.
  function refresh() {
    if (document.hidden) {
      window.setTimeout(refresh, everyMs);
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", redirect: "manual" })
      .then(function (response) {
        if (response.type === "opaqueredirect" || !response.ok) {
          throw new Error("status " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (section) {
          var fresh = section.id && next.getElementById(section.id);
          if (fresh && !busy(section)) {
            section.replaceWith(fresh);
            wireTickAll(fresh);
          }
        });
        var stamp = next.getElementById("live");
        if (live && stamp) {
          live.innerHTML = stamp.innerHTML;
          live.classList.remove("stale");
        }
      })
      .catch(function () {
        if (live) {
          live.classList.add("stale");
          live.title = "could not refresh (logged out, or the server is unreachable): reload";
        }
      })
      .then(function () {
        window.setTimeout(refresh, everyMs);
      });
  }

  wireTickAll(document);
  window.setTimeout(refresh, everyMs);
})();
