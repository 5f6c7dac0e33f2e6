// jobq /docs: Swagger UI on the service's own OpenAPI document. A file, not an inline script,
// so that the page's Content-Security-Policy can forbid inline scripts.
(function () {
  "use strict";
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    validatorUrl: null // no badge: it would send the document to a validator elsewhere
  });
})();
