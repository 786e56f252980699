// plotly.js with only the trace types forksight's figures use (dashboard/app.py PLOTLY_TRACES;
// tests/test_browser_plotly.py checks both): plotly.js's documented partial bundle (CUSTOM_BUNDLE.md)
var Plotly = require('plotly.js/lib/core');
Plotly.register([require('plotly.js/lib/scatter'), require('plotly.js/lib/scattergl'),
                 require('plotly.js/lib/heatmap')]);
module.exports = Plotly;
