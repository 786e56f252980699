// Build ../assets/plotly-forksight.min.js (1.5 MB; Dash's full plotly.min.js is 4.8 MB) with
// plotly.js's own esbuild settings (its esbuild-config.js). The plotly.js version must match
// the one the plotly Python package ships (plotly.offline.get_plotlyjs_version()).
//     cd dashboard/plotly_bundle && npm install && npm run build
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');

esbuild.build({
    entryPoints: ['./entry.js'],
    outfile: '../assets/plotly-forksight.min.js',
    format: 'iife',
    globalName: 'Plotly',
    bundle: true,
    minify: true,
    sourcemap: false,
    plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
    alias: { regl: '@plotly/regl', stream: 'stream-browserify' },
    define: { global: 'window', 'define.amd': 'false' },
    target: 'es2016',
    logLevel: 'info'
}).catch(() => process.exit(1));
